// http.fetch: arguments, result and grant are described in http_fetch.hpp.
#include "engine/tools/http_fetch.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "engine/tools/address_range.hpp"
#include "engine/tools/http_client.hpp"
#include "protocol/text.hpp"

namespace cairn::engine {

namespace {

const std::string tool_name = "http.fetch";

std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::toupper(c); });
  return out;
}

[[noreturn]] void refuse(const std::string& message) { throw tool_error("refused", tool_name + ": " + message); }

// RFC 9110 token characters: what a method or a header name may contain.
bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

bool is_ip_literal(std::string_view host) {
  return host.find(':') != std::string_view::npos || host.find_first_not_of("0123456789.") == std::string_view::npos;
}

// A grant entry: "host", "host:port", "host:*", "[v6]:port", "*.suffix[:port]".
struct host_entry {
  std::string host;                 // lowercase, an IPv6 literal without brackets
  std::optional<std::string> port;  // nullopt: the scheme's default; "*": any
};

std::optional<host_entry> parse_entry(std::string_view entry) {
  std::string pattern = to_lower(entry);
  host_entry out{pattern, std::nullopt};
  if (pattern.starts_with('[')) {
    auto close = pattern.find(']');
    if (close == std::string::npos) return std::nullopt;
    out.host = pattern.substr(1, close - 1);
    if (pattern.size() > close + 1) {
      if (pattern[close + 1] != ':') return std::nullopt;
      out.port = pattern.substr(close + 2);
    }
  } else if (std::count(pattern.begin(), pattern.end(), ':') == 1) {
    out.host = pattern.substr(0, pattern.find(':'));
    out.port = pattern.substr(pattern.find(':') + 1);
  }
  return out;
}

bool host_matches(std::string_view text, const http::url& u) {
  auto entry = parse_entry(text);
  if (!entry) return false;
  const auto port = std::to_string(u.port);
  if (entry->port ? *entry->port != "*" && *entry->port != port : u.port != (u.scheme == "https" ? 443 : 80))
    return false;
  if (entry->host.starts_with("*.")) {
    // Subdomains only, and never an IP address: "*.0.1" must not match 10.0.0.1.
    std::string_view suffix = std::string_view(entry->host).substr(1);
    return !is_ip_literal(u.host) && u.host.size() > suffix.size() && u.host.ends_with(suffix);
  }
  if (u.host == entry->host) return true;
  auto ip = http::canonical_ip(u.host);
  return ip && ip == http::canonical_ip(entry->host);
}

std::string describe(const std::vector<std::string>& items, std::string_view none) {
  return items.empty() ? std::string(none) : fmt::format("{}", fmt::join(items, ", "));
}

// Header values are octets; those that are not UTF-8 are read as Latin-1.
std::string header_text(const std::string& value) {
  if (protocol::is_utf8(value)) return value;
  std::string out;
  for (unsigned char c : value) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

// `data` is at most a grant's max_bytes (1 GiB): its size fits EVP's int.
std::string base64(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');  // EVP_EncodeBlock adds a NUL
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(data.data()), static_cast<int>(data.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

struct fetch_args {
  std::string url;
  std::string method = "GET";
  http::header_list headers;
  std::string body;
};

std::string read_method(const json& args) {
  if (!args.is_object()) refuse("arguments must be an object like {\"url\": \"https://host/path\"}");
  if (!args.contains("method")) return "GET";
  if (!args["method"].is_string() || !is_token(args["method"].get<std::string>()))
    refuse("\"method\" must be an HTTP method name such as \"GET\" or \"POST\"");
  return to_upper(args["method"].get<std::string>());
}

fetch_args read_args(const json& args) {
  fetch_args out;
  out.method = read_method(args);
  for (const auto& [key, value] : args.items())
    if (key != "url" && key != "method" && key != "headers" && key != "body")
      refuse(fmt::format("unknown argument \"{}\"; it takes url, method, headers and body", key));
  if (!args.contains("url") || !args["url"].is_string()) refuse("\"url\" (a string) is required");
  out.url = args["url"].get<std::string>();
  if (args.contains("body")) {
    if (!args["body"].is_string()) refuse("\"body\" must be a string; serialize JSON yourself");
    out.body = args["body"].get<std::string>();
  }
  if (!args.contains("headers")) return out;
  if (!args["headers"].is_object()) refuse("\"headers\" must be an object of strings like {\"accept\": \"text/html\"}");
  static const std::vector<std::string> reserved = {"host", "content-length", "transfer-encoding", "connection",
                                                    "idempotency-key"};
  for (const auto& [name, value] : args["headers"].items()) {
    if (!is_token(name)) refuse(fmt::format("\"{}\" is not a valid header name", name));
    if (!value.is_string()) refuse(fmt::format("the value of header \"{}\" must be a string", name));
    auto text = value.get<std::string>();
    if (text.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos)
      refuse(fmt::format("the value of header \"{}\" contains a line break or NUL", name));
    if (std::find(reserved.begin(), reserved.end(), to_lower(name)) != reserved.end())
      refuse(fmt::format("the host sets the {} header itself; remove it from \"headers\"", name));
    out.headers.emplace_back(name, std::move(text));
  }
  return out;
}

class http_fetch final : public tool {
 public:
  explicit http_fetch(http_fetch_grant grant) : grant_(std::move(grant)) {
    for (auto& method : grant_.methods) method = to_upper(method);
  }

  const std::string& name() const override { return tool_name; }

  idempotency kind(const json& args) const override {
    auto method = read_method(args);
    return method == "GET" || method == "HEAD" || method == "OPTIONS" ? idempotency::idempotent
                                                                      : idempotency::at_most_once;
  }

  json call(const tool_call& call) override {
    auto args = read_args(call.args);
    auto deadline = std::chrono::steady_clock::now() + grant_.timeout;
    check_method(args.method);
    http::url target;
    try {
      target = http::parse_url(args.url);
    } catch (const tool_error& e) {
      refuse(e.what());
    }
    check_host(target, "");
    if (!call.idempotency_key.empty()) args.headers.emplace_back("Idempotency-Key", call.idempotency_key);

    for (int redirects = 0;; ++redirects) {
      http::exchange exchange({args.method, target, args.headers, args.body},
                              {tool_name, deadline, grant_.timeout, grant_.max_response_bytes,
                               [&](const std::string& address) { return refuse_address(target, address); }});
      auto location = exchange.header("location");
      if (!is_redirect(exchange.status()) || !location) return result(exchange, target);
      if (redirects >= grant_.max_redirects)
        throw tool_error("failed", fmt::format("{}: gave up after {} redirects (the grant's limit); the last one "
                                               "pointed to {}", tool_name, redirects, *location));
      auto next = follow(target, *location);
      if (exchange.status() == 303 && args.method != "HEAD") {
        args.method = "GET";
        args.body.clear();
        drop_headers(args.headers, {"content-type"});
      }
      check_method(args.method);
      // Credentials meant for one host do not travel to another.
      if (next.host != target.host) drop_headers(args.headers, {"authorization", "proxy-authorization", "cookie"});
      target = std::move(next);
    }
  }

 private:
  void check_method(const std::string& method) const {
    if (std::find(grant_.methods.begin(), grant_.methods.end(), method) == grant_.methods.end())
      refuse(fmt::format("the method {} is not granted (allowed: {})", method, describe(grant_.methods, "none")));
  }

  // `redirect` is the redirect's Location, empty for the URL the agent asked for.
  void check_host(const http::url& u, std::string_view redirect) const {
    for (const auto& entry : grant_.hosts)
      if (host_matches(entry, u)) return;
    auto host = u.host + ":" + std::to_string(u.port);
    auto allowed = describe(grant_.hosts, "no hosts");
    if (redirect.empty())
      refuse(fmt::format("{} is not among the hosts this run may reach (allowed: {})", host, allowed));
    refuse(fmt::format("a redirect pointed to {}, but {} is not among the hosts this run may reach (allowed: {})",
                       redirect, host, allowed));
  }

  // Why the host may not connect to `address`, one of those `target`'s host
  // resolved to. An IP literal that check_host let through is named in the
  // grant (no wildcard matches an IP); a name may lead anywhere.
  std::optional<std::string> refuse_address(const http::url& target, const std::string& address) const {
    auto range = http::special_range(address);
    if (!range || grant_.private_addresses || http::canonical_ip(target.host) == address) return std::nullopt;
    return fmt::format("it resolves to {}, a {} address; use that address in the URL and name it in the grant's "
                       "\"hosts\", or set \"private\": true",
                       address, *range);
  }

  http::url follow(const http::url& from, const std::string& location) const {
    http::url next;
    try {
      next = http::resolve_location(from, location);
    } catch (const tool_error& e) {
      refuse(fmt::format("did not follow a redirect from {}: {}", from.to_string(), e.what()));
    }
    if (from.scheme == "https" && next.scheme == "http")
      refuse(fmt::format("did not follow a redirect from {} to {}: https never falls back to plain http",
                         from.to_string(), next.to_string()));
    check_host(next, next.to_string());
    return next;
  }

  static void drop_headers(http::header_list& headers, std::initializer_list<std::string_view> names) {
    std::erase_if(headers, [&](const auto& header) {
      return std::find(names.begin(), names.end(), to_lower(header.first)) != names.end();
    });
  }

  static json result(http::exchange& exchange, const http::url& final_url) {
    json headers = json::object();
    for (const auto& [name, value] : exchange.headers()) {
      auto text = header_text(value);
      if (headers.contains(name))
        headers[name] = headers[name].get<std::string>() + ", " + text;
      else
        headers[name] = text;
    }
    json out = {{"status", exchange.status()}, {"url", final_url.to_string()}, {"headers", std::move(headers)}};
    auto body = exchange.read_all();
    if (protocol::is_utf8(body))
      out["body"] = std::move(body);
    else
      out["body_base64"] = base64(body);
    return out;
  }

  http_fetch_grant grant_;
};

}  // namespace

std::unique_ptr<tool> make_http_fetch(http_fetch_grant grant) { return std::make_unique<http_fetch>(std::move(grant)); }

}  // namespace cairn::engine
