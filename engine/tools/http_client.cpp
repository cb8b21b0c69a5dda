#include "engine/tools/http_client.hpp"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
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
  auto sep = text.find("://");
  if (sep == std::string_view::npos) refuse(text, "it is not an absolute URL like https://host/path");
  url u;
  u.scheme = to_lower(text.substr(0, sep));
  if (u.scheme != "http" && u.scheme != "https")
    refuse(text, fmt::format("the scheme '{}' is not allowed; use http or https", u.scheme));
  auto rest = text.substr(sep + 3);
  auto end = std::min(rest.find_first_of("/?#"), rest.size());
  auto authority = rest.substr(0, end);
  if (auto at = authority.rfind('@'); at != std::string_view::npos)  // shown without the credentials
    refuse(fmt::format("{}://...@{}", u.scheme, rest.substr(at + 1)),
           "user info (user@host) is not allowed; send credentials in a header instead");

  std::string_view host, port;
  if (authority.starts_with('[')) {
    auto close = authority.find(']');
    if (close == std::string_view::npos) refuse(text, "its IPv6 address lacks the closing ']'");
    host = authority.substr(1, close - 1);
    auto after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') refuse(text, "something other than a port follows its IPv6 address");
    if (!after.empty()) port = after.substr(1);
    if (host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos)
      refuse(text, "its IPv6 address is malformed");
  } else {
    auto colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
    if (!std::all_of(host.begin(), host.end(), is_host_char))
      refuse(text, "its host has characters a host name cannot have (use punycode for international names)");
  }
  if (host.empty()) refuse(text, "it has no host");
  u.host = to_lower(host);

  u.port = default_port(u.scheme);
  if (!port.empty()) {
    unsigned long value = 0;
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
        (value = std::stoul(std::string(port))) == 0 || value > 65535)
      refuse(text, fmt::format("'{}' is not a port number (1-65535)", port));
    u.port = static_cast<std::uint16_t>(value);
  }

  auto target = rest.substr(end);
  target = target.substr(0, target.find('#'));
  u.target = target.starts_with('/') ? "" : "/";
  for (unsigned char c : target) {
    if (c <= 0x20 || c == 0x7f) refuse(text, "it contains a space or control character; percent-encode it");
    if (c >= 0x80)
      u.target += fmt::format("%{:02X}", c);
    else
      u.target += static_cast<char>(c);
  }
  return u;
}

url resolve_location(const url& base, std::string_view location) {
  while (!location.empty() && std::isspace(static_cast<unsigned char>(location.back()))) location.remove_suffix(1);
  auto scheme_end = location.find("://");
  if (scheme_end != std::string_view::npos && scheme_end > 0 &&
      location.substr(0, scheme_end).find_first_of("/?#") == std::string_view::npos)
    return parse_url(location);
  if (location.starts_with("//")) return parse_url(base.scheme + ":" + std::string(location));
  std::string origin = base.scheme + "://" + base.authority();
  if (location.empty()) return base;
  if (location.starts_with('/')) return parse_url(origin + std::string(location));
  std::string path = base.target.substr(0, base.target.find('?'));
  if (location.starts_with('?')) return parse_url(origin + path + std::string(location));
  return parse_url(origin + path.substr(0, path.rfind('/') + 1) + std::string(location));
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

  // Resolves the host; an IP literal needs no lookup.
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
