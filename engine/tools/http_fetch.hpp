// `http.fetch`: an HTTP(S) request made by the host on the agent's behalf,
// within the run's grant (hosts, methods, size and time limits).
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
  // "example.com" (any port), "example.com:8443", "*.example.com" (subdomains
  // only), "127.0.0.1:8080". Checked for the first URL and every redirect.
  std::vector<std::string> hosts;
  std::vector<std::string> methods = {"GET", "HEAD"};
  std::size_t max_response_bytes = 1 << 20;
  std::chrono::milliseconds timeout{10'000};  // the whole call, redirects included
  int max_redirects = 5;
};

// GET, HEAD and OPTIONS calls are idempotent; any other method at most once.
std::unique_ptr<tool> make_http_fetch(http_fetch_grant grant);

}  // namespace cairn::engine
