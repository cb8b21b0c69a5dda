// Strings as UTF-8 can carry them: a lone surrogate (which JSON.stringify
// writes as an escape the host refuses) becomes U+FFFD. The same as
// String.prototype.isWellFormed and toWellFormed, which are Node 20's
// (ES2024) and missing from Node 18 (Debian 12's nodejs).

const native = typeof String.prototype.isWellFormed === "function";
// With the u flag a surrogate pair is one code point, so only lone halves match.
const loneSurrogate = /[\uD800-\uDFFF]/u;
const loneSurrogates = /[\uD800-\uDFFF]/gu;

export function isWellFormed(text) {
  return native ? text.isWellFormed() : !loneSurrogate.test(text);
}

export function toWellFormed(text) {
  if (isWellFormed(text)) return text;
  return native ? text.toWellFormed() : text.replace(loneSurrogates, "\uFFFD");
}
