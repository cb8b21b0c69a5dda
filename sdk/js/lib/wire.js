// The frame codec and the JSON the protocol carries (protocol/PROTOCOL.md §1.2):
// a frame is a 4-byte big-endian payload length, then that many bytes of one
// UTF-8 JSON object; 16 MiB at most each way.

import { HostGone } from "./errors.js";
import { isWellFormed, toWellFormed } from "./well_formed.js";

export const maxFrame = 16 * 1024 * 1024;
const headerSize = 4;

// A value JSON cannot hold as it is: thrown by the replacer, turned into a
// TypeError that names what was being serialized.
class NotJson extends Error {}

function describeKey(holder, key) {
  if (key === "") return "";
  return Array.isArray(holder) ? ` at index ${key}` : ` at key ${JSON.stringify(key)}`;
}

// JSON.stringify would turn NaN and Infinity into null, an undefined array
// element into null and a Map or Set into {}: a replayed value would then
// differ from the live one, so they are refused instead.
function strict(key, value) {
  switch (typeof value) {
    case "string":
      return toWellFormed(value);
    case "number":
      if (Number.isFinite(value)) return value;
      throw new NotJson(`${value}${describeKey(this, key)}`);
    case "bigint":
      throw new NotJson(`a BigInt${describeKey(this, key)} (convert it to a number or a string)`);
    case "undefined":
    case "function":
    case "symbol":
      if (Array.isArray(this)) throw new NotJson(`${typeof value}${describeKey(this, key)}`);
      return undefined; // an object member JSON has no value for is left out, as JSON.stringify does
    case "object":
      if (value instanceof Map || value instanceof Set)
        throw new NotJson(`a ${value.constructor.name}${describeKey(this, key)} (convert it to an object or array)`);
      return value;
    default:
      return value;
  }
}

// Object keys are not passed through the replacer: this one also rebuilds an
// object whose keys hold lone surrogates, which the host refuses as UTF-8.
function strictWithKeys(key, value) {
  const v = strict.call(this, key, value);
  if (v === null || typeof v !== "object" || Array.isArray(v)) return v;
  const keys = Object.keys(v);
  if (keys.every(isWellFormed)) return v;
  return Object.fromEntries(keys.map((k) => [toWellFormed(k), v[k]]));
}

// JSON.stringify writes a lone surrogate as an escape like \udc00; a match
// sends the value through the slower replacer that repairs keys too.
const escapedSurrogate = /\\u[dD][89a-fA-F]/;

// The JSON text of `value`, as the host accepts it: undefined at the top is
// null, a lone surrogate becomes U+FFFD, and NaN, ±Infinity, BigInt, an
// undefined array element, a Map or Set or a cycle throw a TypeError that
// starts with `what`.
export function toJsonText(value, what) {
  if (value === undefined) return "null";
  try {
    const text = JSON.stringify(value, strict);
    return escapedSurrogate.test(text) ? JSON.stringify(value, strictWithKeys) : text;
  } catch (e) {
    if (e instanceof NotJson) throw new TypeError(`${what} is not JSON: it holds ${e.message}`);
    throw new TypeError(`${what} is not JSON: ${e.message}`);
  }
}

// `s` cut to at most `max` bytes of UTF-8 (on a character boundary), for a
// field the host bounds.
export function clip(s, max) {
  if (Buffer.byteLength(s) <= max) return s;
  const bytes = Buffer.from(s);
  let end = max - 3;
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--;
  return `${bytes.subarray(0, end).toString()}...`;
}

// `value` as text, even when its toString throws.
export function safeString(value) {
  try {
    return String(value);
  } catch {
    return typeof value;
  }
}

// A frame too large for the host to read.
export class FrameTooLarge extends RangeError {}

// One frame holding the JSON object text `text`.
export function encodeFrame(text) {
  const n = Buffer.byteLength(text, "utf8");
  if (n > maxFrame)
    throw new FrameTooLarge(`a message of ${n} bytes is over the protocol's frame limit of ${maxFrame} bytes (16 MiB)`);
  const frame = Buffer.allocUnsafe(headerSize + n);
  frame.writeUInt32BE(n, 0);
  frame.write(text, headerSize, "utf8");
  return frame;
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

function parsePayload(payload) {
  let text;
  try {
    text = utf8.decode(payload);
  } catch {
    throw new HostGone("the host sent a frame that is not valid UTF-8");
  }
  let value;
  try {
    value = JSON.parse(text); // a byte-order mark stays in `text` and fails here, as it must
  } catch (e) {
    throw new HostGone(`the host sent a frame that is not JSON: ${e.message}`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value))
    throw new HostGone("the host sent a frame that is not a JSON object");
  return value;
}

// Reassembles frames from a byte stream fed in pieces of any size. A frame's
// payload is copied once, into a buffer of its announced size.
export class FrameDecoder {
  #header = Buffer.alloc(headerSize);
  #headerFill = 0;
  #payload = null;
  #payloadFill = 0;

  // Feeds `bytes` and returns the JSON objects of the frames they complete.
  // Throws HostGone for a length of 0 or above 16 MiB as soon as its header
  // is in, and for a payload that is not one JSON object in valid UTF-8.
  feed(bytes) {
    const messages = [];
    let at = 0;
    while (at < bytes.length) {
      if (this.#payload === null) {
        const take = Math.min(headerSize - this.#headerFill, bytes.length - at);
        bytes.copy(this.#header, this.#headerFill, at, at + take);
        this.#headerFill += take;
        at += take;
        if (this.#headerFill < headerSize) break;
        const n = this.#header.readUInt32BE(0);
        if (n === 0 || n > maxFrame)
          throw new HostGone(`the host sent a frame length of ${n} (a frame holds 1 to ${maxFrame} bytes)`);
        this.#payload = Buffer.allocUnsafe(n);
        this.#payloadFill = 0;
      }
      const take = Math.min(this.#payload.length - this.#payloadFill, bytes.length - at);
      bytes.copy(this.#payload, this.#payloadFill, at, at + take);
      this.#payloadFill += take;
      at += take;
      if (this.#payloadFill === this.#payload.length) {
        messages.push(parsePayload(this.#payload));
        this.#payload = null;
        this.#headerFill = 0;
      }
    }
    return messages;
  }
}
