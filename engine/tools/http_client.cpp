#include "engine/tools/http_client.hpp"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>
#include <fmt/format.h>

#include "engine/tools/name_resolver.hpp"
#include "engine/tools/tool.hpp"

namespace cairn::engine::http {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

namespace {

std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::uint16_t default_port(std::string_view scheme) { return scheme == "https" ? 443 : 80; }

[[noreturn]] void refuse(std::string_view text, std::string_view problem) {
  constexpr std::size_t shown = 200;
  throw tool_error("refused", fmt::format("'{}{}' is not a usable URL: {}", text.substr(0, shown),
                                          text.size() > shown ? "..." : "", problem));
}

bool is_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

// `text` with its bytes >= 0x80 percent-encoded, as agents often leave them
// in paths. A space or a control character is refused: it would change
// where the URL ends.
std::string percent_encode_non_ascii(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c <= 0x20 || c == 0x7f) refuse(text, "it contains a space or control character; percent-encode it");
    if (c >= 0x80)
      out += fmt::format("%{:02X}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

// The path of `segments` without "." and ".." (RFC 3986 section 5.2.4), also
// when percent-encoded ("%2e%2e"), so that what the grant is checked against
// and what the result reports is what the server is asked for. A ".." above
// the root is dropped. (Boost.URL 1.81's own normalize() and resolve() decode
// "%2F" into a separator, which changes the path: not used.)
std::string without_dot_segments(const boost::urls::segments_encoded_view& segments) {
  std::vector<std::string_view> kept;
  bool ends_in_folder = false;
  for (const auto segment : segments) {
    const std::string decoded = segment.decode();
    ends_in_folder = decoded == "." || decoded == "..";
    if (decoded == ".." && !kept.empty())
      kept.pop_back();
    else if (!ends_in_folder)
      kept.emplace_back(segment.data(), segment.size());
  }
  std::string path;
  for (const auto segment : kept) path.append("/").append(segment);
  return path.empty() || ends_in_folder ? path + "/" : path;
}

// The shared client TLS setup: the system CA store, peer verification on.
ssl::context& tls_context() {
  static ssl::context context = [] {
    ssl::context c(ssl::context::tls_client);
    c.set_default_verify_paths();
    c.set_verify_mode(ssl::verify_peer);
    return c;
  }();
  return context;
}

}  // namespace

std::string url::authority() const {
  std::string h = host.find(':') == std::string::npos ? host : "[" + host + "]";
  return port == default_port(scheme) ? h : h + ":" + std::to_string(port);
}

std::string url::to_string() const { return scheme + "://" + authority() + target; }

url parse_url(std::string_view text) {
  if (text.find("://") == std::string_view::npos) refuse(text, "it is not an absolute URL like https://host/path");
  const std::string encoded = percent_encode_non_ascii(text);
  auto parsed = boost::urls::parse_uri(encoded);
  if (!parsed) refuse(text, "it is not a valid URL (RFC 3986): " + parsed.error().message());
  const boost::urls::url_view& v = *parsed;
  url u;
  u.scheme = to_lower(v.scheme());
  if (u.scheme != "http" && u.scheme != "https")
    refuse(text, fmt::format("the scheme '{}' is not allowed; use http or https", u.scheme));
  if (v.has_userinfo())  // shown without the credentials
    refuse(fmt::format("{}://...@{}", u.scheme, encoded.substr(encoded.find('@') + 1)),
           "user info (user@host) is not allowed; send credentials in a header instead");

  if (v.host_type() == boost::urls::host_type::ipv6) {
    u.host = v.host_ipv6_address().to_string();
  } else if (v.host_type() == boost::urls::host_type::ipvfuture) {
    refuse(text, "its host is an IPvFuture literal; use an IPv6 address or a name");
  } else {
    // Percent-encoded names are refused, not decoded: the grant is checked
    // against exactly the name that is looked up and sent as Host.
    u.host = to_lower(v.encoded_host());
    if (!std::all_of(u.host.begin(), u.host.end(), is_host_char))
      refuse(text, "its host has characters a host name cannot have (use punycode for international names)");
  }
  if (u.host.empty()) refuse(text, "it has no host");

  u.port = default_port(u.scheme);
  if (const std::string_view port = v.port(); !port.empty()) {
    unsigned long value = 0;
    if (port.size() > 5 || (value = std::stoul(std::string(port))) == 0 || value > 65535)
      refuse(text, fmt::format("'{}' is not a port number (1-65535)", port));
    u.port = static_cast<std::uint16_t>(value);
  }

  u.target = without_dot_segments(v.encoded_segments());
  if (v.has_query()) u.target += "?" + std::string(v.encoded_query());
  return u;
}

// RFC 3986 section 5.2.2, on the parsed reference; parse_url then removes the
// dot segments of the merged path.
url resolve_location(const url& base, std::string_view location) {
  while (!location.empty() && std::isspace(static_cast<unsigned char>(location.back()))) location.remove_suffix(1);
  const std::string encoded = percent_encode_non_ascii(location);
  auto parsed = boost::urls::parse_uri_reference(encoded);
  if (!parsed) refuse(location, "it is not a valid URL reference (RFC 3986): " + parsed.error().message());
  const boost::urls::url_view& ref = *parsed;
  if (ref.has_scheme()) return parse_url(encoded);
  if (ref.has_authority()) return parse_url(base.scheme + ":" + encoded);
  const std::string origin = base.scheme + "://" + base.authority();
  const std::string base_path = base.target.substr(0, base.target.find('?'));
  const std::string query = ref.has_query() ? "?" + std::string(ref.encoded_query()) : "";
  if (ref.encoded_path().empty())
    return parse_url(origin + (ref.has_query() ? base_path + query : base.target));
  if (ref.is_path_absolute()) return parse_url(origin + std::string(ref.encoded_path()) + query);
  return parse_url(origin + base_path.substr(0, base_path.rfind('/') + 1) + std::string(ref.encoded_path()) + query);
}

struct exchange::impl {
  options opts;
  std::string where;  // "host:port", for messages
  net::io_context ioc;
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::buffer_body> parser;
  header_list headers;
  std::array<char, 16 * 1024> chunk{};

  impl(options o, const url& target)
      : opts(std::move(o)), where(target.host.find(':') == std::string::npos ? target.host : "[" + target.host + "]") {
    where += ":" + std::to_string(target.port);
  }

  beast::tcp_stream& tcp_layer() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  template <class F>
  error_code on_stream(F&& f) {
    return tls ? f(*tls) : f(*plain);
  }

  // Starts one asynchronous operation and runs it to completion. The
  // tcp_stream's expiry (the deadline) bounds every operation but DNS.
  template <class Start>
  error_code wait(Start&& start) {
    error_code result = net::error::would_block;
    start([&result](error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  [[noreturn]] void fail_timeout() {
    throw tool_error("timeout",
                     fmt::format("{}: {} did not answer within {} ms", opts.who, where, opts.timeout.count()));
  }

  [[noreturn]] void fail_connect(std::string_view reason) {
    throw tool_error("unavailable", fmt::format("{} could not connect to {}: {}", opts.who, where, reason));
  }

  [[noreturn]] void fail_read(error_code ec) {
    if (ec == beast::error::timeout) fail_timeout();
    if (ec == bhttp::error::body_limit)
      throw tool_error("too_large", fmt::format("{}: the response from {} is larger than the limit of {} bytes",
                                                opts.who, where, opts.max_body_bytes));
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message)
      throw tool_error("unavailable", fmt::format("{}: {} closed the connection before its answer was complete",
                                                  opts.who, where));
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category())
      throw tool_error("bad_output", fmt::format("{}: {} did not answer with valid HTTP: {}", opts.who, where,
                                                 ec.message()));
    throw tool_error("unavailable", fmt::format("{}: the connection to {} broke: {}", opts.who, where, ec.message()));
  }

  // Resolves the host; an IP literal needs no lookup. Waits on the tool
  // call's thread (tool_broker::perform runs on pool::tools), never a loop's.
  std::vector<tcp::endpoint> resolve(const url& target) {
    error_code ec;
    auto address = net::ip::make_address(target.host, ec);
    if (!ec) return {tcp::endpoint(address, target.port)};
    auto& resolver = opts.resolver ? *opts.resolver : process_resolver();
    auto answer = resolver.resolve(target.host, opts.deadline);
    if (!answer)
      throw tool_error("timeout", fmt::format("{}: the name {} was not looked up within {} ms: the system's "
                                              "resolver is slow or does not answer",
                                              opts.who, target.host, opts.timeout.count()));
    if (!answer->error.empty()) fail_connect(answer->error);
    std::vector<tcp::endpoint> endpoints;
    for (const auto& text : answer->addresses) {
      auto a = net::ip::make_address(text, ec);
      if (!ec) endpoints.emplace_back(a, target.port);
    }
    if (endpoints.empty()) fail_connect("the name has no address");
    return endpoints;
  }

  // The resolved endpoints that options.refuse_address lets through.
  std::vector<tcp::endpoint> allowed(std::vector<tcp::endpoint> endpoints, const url& target) {
    if (!opts.refuse_address || endpoints.empty()) return endpoints;
    std::string refusal;
    std::erase_if(endpoints, [&](const tcp::endpoint& e) {
      auto reason = opts.refuse_address(e.address().to_string());
      if (reason && refusal.empty()) refusal = *reason;
      return reason.has_value();
    });
    if (endpoints.empty())
      throw tool_error("refused", fmt::format("{}: will not connect to {}: {}", opts.who, target.host, refusal));
    return endpoints;
  }

  void connect(const url& target) {
    auto endpoints = allowed(resolve(target), target);
    if (target.scheme == "https") {
      tls.emplace(ioc, tls_context());
      // SNI carries names only (RFC 6066); the verify callback checks names and IPs.
      if (target.host.find_first_not_of("0123456789.:") != std::string::npos &&
          !SSL_set_tlsext_host_name(tls->native_handle(), target.host.c_str()))
        fail_connect("could not set the TLS server name");
      tls->set_verify_callback(ssl::host_name_verification(target.host));
    } else {
      plain.emplace(ioc);
    }
    tcp_layer().expires_at(opts.deadline);
    auto ec = wait([&](auto handler) { tcp_layer().async_connect(endpoints, std::move(handler)); });
    if (ec == beast::error::timeout) fail_timeout();
    if (ec) fail_connect(ec.message());
    if (tls) {
      ec = wait([&](auto handler) { tls->async_handshake(ssl::stream_base::client, std::move(handler)); });
      if (ec == beast::error::timeout) fail_timeout();
      if (ec) fail_connect("the TLS handshake failed: " + ec.message());
    }
  }

  void send(const request& req) {
    bhttp::request<bhttp::string_body> message;
    message.method_string(req.method);
    message.target(req.target.target);
    message.version(11);
    message.set(bhttp::field::host, req.target.authority());
    message.set(bhttp::field::user_agent, "cairn");
    for (const auto& [name, value] : req.headers) message.insert(name, value);
    message.keep_alive(false);
    message.body() = req.body;
    message.prepare_payload();
    auto ec = on_stream([&](auto& stream) {
      return wait([&](auto handler) { bhttp::async_write(stream, message, std::move(handler)); });
    });
    if (ec == beast::error::timeout) fail_timeout();
    if (ec)
      throw tool_error("unavailable", fmt::format("{}: the connection to {} broke while sending the request: {}",
                                                  opts.who, where, ec.message()));
  }

  void read_head(bool head_request) {
    parser.body_limit(opts.max_body_bytes);
    parser.header_limit(64 * 1024);
    // A HEAD response announces a Content-Length but has no body.
    parser.skip(head_request);
    auto ec = on_stream([&](auto& stream) {
      return wait([&](auto handler) { bhttp::async_read_header(stream, buffer, parser, std::move(handler)); });
    });
    if (ec) fail_read(ec);
    for (const auto& field : parser.get()) headers.emplace_back(to_lower(field.name_string()), field.value());
  }

  std::optional<std::string> read_some() {
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      auto ec = on_stream([&](auto& stream) {
        return wait([&](auto handler) { bhttp::async_read_some(stream, buffer, parser, std::move(handler)); });
      });
      if (ec == bhttp::error::need_buffer) ec = {};
      if (ec) fail_read(ec);
      std::size_t n = chunk.size() - parser.get().body().size;
      if (n > 0) return std::string(chunk.data(), n);
    }
    return std::nullopt;
  }
};

exchange::exchange(const request& req, options opts) : impl_(std::make_unique<impl>(std::move(opts), req.target)) {
  try {
    impl_->connect(req.target);
  } catch (const boost::system::system_error& e) {  // e.g. the CA store could not be loaded
    impl_->fail_connect(e.code().message());
  }
  impl_->send(req);
  impl_->read_head(req.method == "HEAD");
}

exchange::~exchange() = default;

int exchange::status() const { return impl_->parser.get().result_int(); }

const header_list& exchange::headers() const { return impl_->headers; }

std::optional<std::string> exchange::header(std::string_view name) const {
  for (const auto& [key, value] : impl_->headers)
    if (key == name) return value;
  return std::nullopt;
}

std::optional<std::string> exchange::read_some() { return impl_->read_some(); }

std::string exchange::read_all() {
  std::string body;
  while (auto piece = impl_->read_some()) body += *piece;
  return body;
}

}  // namespace cairn::engine::http
