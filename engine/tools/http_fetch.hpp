// `http.fetch`: an HTTP(S) request made by the host on the agent's behalf,
// within the run's grant (hosts, methods, size and time limits).
//
// Egress: the host resolves each name once and connects to the addresses it
// checked. Loopback, link-local, private, shared (CGNAT), unspecified,
// multicast, reserved and cloud metadata addresses (address_range.hpp) are
// refused unless the URL is that address and the grant names it in `hosts`
// ("127.0.0.1:8080"), or the grant sets `private`.
// A redirect is checked like the first URL, and never goes from https to http.
// A URL's path is resolved before anything is checked or sent: dot segments,
// percent-encoded ones too, are removed (http_client.hpp).
//
// Arguments: {"url": "https://host/path", "method": "GET", "headers": {...},
//             "body": "text"}            (method, headers, body optional)
// Result:    {"status": 200, "url": "final URL after redirects",
//             "headers": {"content-type": "..."}, "body": "text"}
//            (or "body_base64" when the body is not valid UTF-8)
// An HTTP error status is a result, not a tool_error: the agent decides.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/tools/tool.hpp"

namespace cairn::engine {

struct http_fetch_grant {
  // "example.com" (the scheme's default port: 443 for https, 80 for http),
  // "example.com:8443", "example.com:*" (any port), "*.example.com"
  // (subdomains only), "127.0.0.1:8080", "[::1]:8080". Checked for the first
  // URL and every redirect.
  std::vector<std::string> hosts;
  // Reach special addresses (loopback, private networks, metadata...) too.
  bool private_addresses = false;
  std::vector<std::string> methods = {"GET", "HEAD"};
  std::size_t max_response_bytes = 1 << 20;
  // The whole call, redirects included; a policy sets min_network_timeout at least.
  std::chrono::milliseconds timeout{10'000};
  int max_redirects = 5;
};

// GET, HEAD and OPTIONS calls are idempotent; any other method at most once.
std::unique_ptr<tool> make_http_fetch(http_fetch_grant grant);

}  // namespace cairn::engine
