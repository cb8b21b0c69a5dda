// A small synchronous HTTP/1.1 client for the host-side tools: one request and
// its response over a fresh connection, https verified against the system CA
// store. Internal to engine/tools; Boost.Beast and OpenSSL stay in the .cpp.
//
// Every failure is a tool_error whose message starts with `options.who`:
//   "unavailable" no connection (DNS, refused, TLS handshake, connection lost)
//   "timeout"     the deadline passed; no call blocks past it (a name lookup
//                 still under way is left to the resolver's bounded threads)
//   "too_large"   the body exceeds options.max_body_bytes
//   "bad_output"  the answer is not HTTP
//   "refused"     options.refuse_address refused every address of the host
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cairn::engine::http {

class name_resolver;

struct url {
  std::string scheme;  // "http" or "https"
  std::string host;    // lowercase; an IPv6 literal without its brackets
  std::uint16_t port = 0;
  std::string target;  // "/path?query", never empty; no fragment, no dot segment

  std::string authority() const;  // "host" or "host:port" when the port is not the scheme's default
  std::string to_string() const;
};

// Parses an absolute http(s) URL (RFC 3986). Throws tool_error("refused") that
// names the problem: another scheme, user info, no host, a percent-encoded
// host name, a bad port, a space or control character. Bytes >= 0x80 in the
// target are percent-encoded; the path has no "." or ".." segment, written
// plainly or percent-encoded ("/a/%2e%2e/b" is "/b").
url parse_url(std::string_view text);

// The URL a Location header points to, relative to `base`.
url resolve_location(const url& base, std::string_view location);

using header_list = std::vector<std::pair<std::string, std::string>>;

struct request {
  std::string method;  // sent as given
  url target;
  header_list headers;  // Host and Content-Length are set by the client
  std::string body;
};

struct options {
  std::string who;  // starts every error message, e.g. "http.fetch"
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout;  // only for messages: the budget the deadline came from
  std::size_t max_body_bytes = 1 << 20;
  // Judges each address the host's one lookup of the target gave (its text,
  // e.g. "127.0.0.1"): why it may not be reached, or nullopt. The connection
  // goes only to the addresses judged, so a second lookup cannot swap them.
  // Empty: every address may be reached.
  std::function<std::optional<std::string>(const std::string& address)> refuse_address;
  // Looks the target's name up (name_resolver.hpp); null: process_resolver().
  // Must outlive the exchange's constructor.
  name_resolver* resolver = nullptr;
};

// One exchange: the constructor connects, sends the request and reads the
// response head; the body is then read in pieces or whole. Closes the
// connection when destroyed.
class exchange {
 public:
  exchange(const request& req, options opts);
  ~exchange();
  exchange(const exchange&) = delete;
  exchange& operator=(const exchange&) = delete;

  int status() const;
  const header_list& headers() const;  // names lowercase, in the order received
  // The first value of header `name` (lowercase).
  std::optional<std::string> header(std::string_view name) const;

  // The next piece of the body as soon as it arrives; nullopt at its end.
  std::optional<std::string> read_some();
  // The rest of the body.
  std::string read_all();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cairn::engine::http
