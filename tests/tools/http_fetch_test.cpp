// http.fetch against a local server: what an agent gets back, and what the
// grant stops before any request leaves the host.
#include "engine/tools/http_fetch.hpp"

#include "engine/tools/address_range.hpp"

#include <netinet/in.h>
#include <map>
#include <optional>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "tests/tools/mock_server.hpp"

namespace cairn::engine::test {
namespace {

// The mock servers listen on 127.0.0.1, which the grant names: loopback is
// reachable only so.
http_fetch_grant local_grant() {
  http_fetch_grant grant;
  grant.hosts = {"127.0.0.1:*"};
  return grant;
}

json fetch(const http_fetch_grant& grant, json args) {
  return make_http_fetch(grant)->call(make_call(std::move(args)));
}

json fetch_url(const http_fetch_grant& grant, const std::string& url) { return fetch(grant, {{"url", url}}); }

// A mock server that serves hello.txt and a few bytes that are not UTF-8.
struct page_server {
  testing::temp_dir pages;
  mock_server server;
  page_server() : server(write_pages(pages)) {}

  static std::vector<std::string> write_pages(const testing::temp_dir& dir) {
    std::ofstream(dir / "hello.txt") << "hello from the page\n";
    std::ofstream(dir / "binary.bin", std::ios::binary) << std::string("\xff\xfe\x00", 3);
    std::ofstream(dir / "one.bin", std::ios::binary) << "\xff";
    std::ofstream(dir / "two.bin", std::ios::binary) << "\xff\xfe";
    return {"--pages", dir.path().string()};
  }
};

}  // namespace

TEST_CASE("an allowed GET returns status, final URL, lowercase headers and body") {
  page_server s;
  auto result = fetch_url(local_grant(), s.server.url("/pages/hello.txt"));
  CHECK(result["status"] == 200);
  CHECK(result["url"] == s.server.url("/pages/hello.txt"));
  CHECK(result["body"] == "hello from the page\n");
  CHECK(result["headers"]["content-type"].get<std::string>().starts_with("text/plain"));
  CHECK(result["headers"]["content-length"] == "20");
  CHECK_FALSE(result.contains("body_base64"));
}

TEST_CASE("a body that is not UTF-8 comes back as body_base64") {
  page_server s;
  auto result = fetch_url(local_grant(), s.server.url("/pages/binary.bin"));
  CHECK(result["body_base64"] == "//4A");
  CHECK_FALSE(result.contains("body"));
  // Padded when the length is not a multiple of 3.
  CHECK(fetch_url(local_grant(), s.server.url("/pages/one.bin"))["body_base64"] == "/w==");
  CHECK(fetch_url(local_grant(), s.server.url("/pages/two.bin"))["body_base64"] == "//4=");
}

TEST_CASE("an HTTP error status is a result for the agent, not a tool error") {
  mock_server server;
  auto result = fetch_url(local_grant(), server.url("/status/503"));
  CHECK(result["status"] == 503);
  CHECK(json::parse(result["body"].get<std::string>())["error"]["message"] == "mock status 503");
}

TEST_CASE("HEAD returns the headers without waiting for a body") {
  mock_server server;
  auto grant = local_grant();
  auto result = fetch(grant, {{"url", server.url("/big?bytes=5000")}, {"method", "HEAD"}});
  CHECK(result["status"] == 200);
  CHECK(result["headers"]["content-length"] == "5000");
  CHECK(result["body"] == "");
}

TEST_CASE("a host outside the grant is refused, named, and never contacted") {
  mock_server server;
  http_fetch_grant grant;
  grant.hosts = {"example.com", "*.example.org"};
  auto error = error_of([&] { fetch_url(grant, server.url("/echo")); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("127.0.0.1:" + std::to_string(server.port())) &&
                               Catch::Contains("example.com, *.example.org"));
  CHECK(server.requests().empty());
}

TEST_CASE("grant host entries: exact port, any port, case, subdomains only, IPs literally") {
  mock_server server;
  auto port = std::to_string(server.port());
  auto allowed_by = [&](std::string entry, std::string url, bool private_addresses = true) {
    http_fetch_grant grant;
    grant.hosts = {std::move(entry)};
    grant.private_addresses = private_addresses;
    try {
      return fetch_url(grant, url)["status"] == 200;
    } catch (const tool_error& e) {
      INFO(e.what());
      CHECK(e.type() == "refused");
      return false;
    }
  };
  CHECK(allowed_by("127.0.0.1:" + port, server.url("/echo")));
  CHECK(allowed_by("127.0.0.1:*", server.url("/echo")));
  CHECK_FALSE(allowed_by("127.0.0.1:1", server.url("/echo")));
  CHECK_FALSE(allowed_by("127.0.0.1", server.url("/echo")));  // no port: the scheme's default, 80
  CHECK(allowed_by("LOCALHOST:" + port, "http://localhost:" + port + "/echo"));
  CHECK_FALSE(allowed_by("*.localhost", "http://localhost:" + port + "/echo"));
  CHECK_FALSE(allowed_by("*.0.0.1", server.url("/echo")));
  CHECK_FALSE(allowed_by("127.0.0.10", server.url("/echo")));
}

TEST_CASE("a name that resolves to loopback is refused unless the grant names the address or sets private") {
  mock_server server;
  const auto port = std::to_string(server.port());
  const auto url = "http://localhost:" + port + "/echo";
  http_fetch_grant grant;
  grant.hosts = {"localhost:" + port};
  auto error = error_of([&] { fetch_url(grant, url); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("loopback") && Catch::Contains("\"private\": true"));
  CHECK(server.requests().empty());

  grant.hosts = {"localhost:" + port, "127.0.0.1:" + port};  // the address, named: only as itself
  CHECK(error_of([&] { fetch_url(grant, url); }).type() == "refused");
  CHECK(fetch_url(grant, server.url("/echo"))["status"] == 200);
  grant.hosts = {"localhost:" + port};
  grant.private_addresses = true;
  CHECK(fetch_url(grant, url)["status"] == 200);
}

TEST_CASE("a redirect to loopback is checked like the first URL") {
  mock_server server;
  const auto port = std::to_string(server.port());
  http_fetch_grant grant;
  grant.hosts = {"127.0.0.1:" + port, "localhost:" + port};
  auto error = error_of([&] { fetch_url(grant, server.url("/redirect?to=http://localhost:" + port + "/echo")); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("loopback"));
  CHECK(server.requests().size() == 1);  // the redirect, not its target
}

TEST_CASE("special address ranges: loopback, private, shared, link-local, metadata, multicast, unspecified") {
  using http::special_range;
  const std::map<std::string, std::optional<std::string>> expected = {
      {"169.254.169.254", "metadata"}, {"fd00:ec2::254", "metadata"},  {"127.0.0.1", "loopback"},
      {"127.255.0.9", "loopback"},     {"::1", "loopback"},            {"10.1.2.3", "private"},
      {"172.16.0.1", "private"},       {"172.31.255.255", "private"},  {"192.168.1.1", "private"},
      {"fc00::1", "private"},          {"fd12:3456::1", "private"},    {"100.64.0.1", "shared"},
      {"100.127.255.255", "shared"},   {"169.254.0.1", "link-local"},  {"fe80::1", "link-local"},
      {"0.0.0.0", "unspecified"},      {"::", "unspecified"},          {"224.0.0.1", "multicast"},
      {"ff02::1", "multicast"},        {"255.255.255.255", "reserved"}, {"::ffff:127.0.0.1", "loopback"},
      {"::ffff:10.0.0.1", "private"},  {"64:ff9b::a9fe:a9fe", "metadata"},
      {"8.8.8.8", std::nullopt},       {"172.32.0.1", std::nullopt},   {"100.128.0.1", std::nullopt},
      {"2001:4860:4860::8888", std::nullopt}};
  for (const auto& [address, range] : expected) {
    INFO(address);
    CHECK(special_range(address) == range);
  }
  CHECK(http::canonical_ip("FD00:EC2:0::254") == "fd00:ec2::254");
  CHECK_FALSE(http::canonical_ip("example.com"));
}

TEST_CASE("a method outside the grant is refused before any request") {
  mock_server server;
  auto error = error_of([&] { fetch(local_grant(), {{"url", server.url("/echo")}, {"method", "POST"}}); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("POST") && Catch::Contains("GET, HEAD"));
  CHECK(server.requests().empty());
}

TEST_CASE("redirects within the grant are followed and the final URL reported") {
  page_server s;
  auto target = s.server.url("/pages/hello.txt");
  auto result = fetch_url(local_grant(), s.server.url("/redirect?to=" + target));
  CHECK(result["status"] == 200);
  CHECK(result["url"] == target);
  CHECK(result["body"] == "hello from the page\n");

  auto chain = fetch_url(local_grant(), s.server.url("/redirect?n=3"));  // relative Locations
  CHECK(chain["url"] == s.server.url("/redirect?n=0"));
  CHECK(chain["body"] == "redirects done\n");
}

// An agent that writes dot segments, plain or percent-encoded, gets the path
// they resolve to: that is what the host checks, asks the server for and
// reports, not a path another server might read another way.
TEST_CASE("dot segments, plain or percent-encoded, are resolved before the request leaves the host") {
  page_server s;
  for (const std::string path : {"/echo/../pages/hello.txt", "/echo/%2e%2e/pages/hello.txt",
                                 "/echo/%2E./x/../../../pages/./hello.txt", "/pages/%2e/hello.txt"}) {
    INFO(path);
    auto result = fetch_url(local_grant(), s.server.url(path));
    CHECK(result["url"] == s.server.url("/pages/hello.txt"));
    CHECK(result["body"] == "hello from the page\n");
  }
  for (const auto& request : s.server.requests()) CHECK(request["path"] == "/pages/hello.txt");
}

TEST_CASE("a redirect's Location is resolved to a path without dot segments") {
  page_server s;
  // The server decodes ?to= once: Locations "/echo/../pages/hello.txt" and "/echo/%2e%2e/pages/hello.txt".
  for (const std::string to : {"/echo/../pages/hello.txt", "/echo/%252e%252e/pages/hello.txt"}) {
    INFO(to);
    auto result = fetch_url(local_grant(), s.server.url("/redirect?to=" + to));
    CHECK(result["url"] == s.server.url("/pages/hello.txt"));
    CHECK(result["body"] == "hello from the page\n");
    CHECK(s.server.requests().back()["path"] == "/pages/hello.txt");
  }
}

TEST_CASE("a redirect to a host outside the grant is refused, naming the target") {
  mock_server server, elsewhere;
  http_fetch_grant grant;
  grant.hosts = {"127.0.0.1:" + std::to_string(server.port())};
  auto target = elsewhere.url("/echo");
  auto error = error_of([&] { fetch_url(grant, server.url("/redirect?to=" + target)); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains(target));
  CHECK(elsewhere.requests().empty());
}

TEST_CASE("more redirects than the grant allows fail") {
  mock_server server;
  auto grant = local_grant();
  grant.max_redirects = 2;
  auto error = error_of([&] { fetch_url(grant, server.url("/redirect?n=5")); });
  CHECK(error.type() == "failed");
  CHECK_THAT(error.what(), Catch::Contains("2 redirects"));
  CHECK(server.requests().size() == 3);
}

TEST_CASE("303 turns the request into a GET; 307 keeps the method and body") {
  mock_server server;
  auto grant = local_grant();
  grant.methods = {"GET", "POST"};
  json args = {{"method", "POST"}, {"body", "payload"}};
  args["url"] = server.url("/redirect?status=303&to=/echo");
  auto after_303 = json::parse(fetch(grant, args)["body"].get<std::string>());
  CHECK(after_303["method"] == "GET");
  CHECK(after_303["body"] == "");
  args["url"] = server.url("/redirect?status=307&to=/echo");
  auto after_307 = json::parse(fetch(grant, args)["body"].get<std::string>());
  CHECK(after_307["method"] == "POST");
  CHECK(after_307["body"] == "payload");
}

TEST_CASE("every request, redirects included, carries the call's Idempotency-Key and the agent's headers") {
  mock_server server;
  json args = {{"url", server.url("/redirect?to=/echo")}, {"headers", {{"X-Agent", "research"}}}};
  auto echoed = json::parse(fetch(local_grant(), args)["body"].get<std::string>());
  CHECK(echoed["headers"]["idempotency-key"] == "run-1/7");
  CHECK(echoed["headers"]["x-agent"] == "research");
  auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[0]["headers"]["Idempotency-Key"] == "run-1/7");
}

TEST_CASE("a body over the grant's cap is too_large; one at the cap is returned") {
  mock_server server;
  auto grant = local_grant();
  grant.max_response_bytes = 1000;
  CHECK(fetch_url(grant, server.url("/big?bytes=1000"))["body"].get<std::string>().size() == 1000);
  auto error = error_of([&] { fetch_url(grant, server.url("/big?bytes=5000")); });
  CHECK(error.type() == "too_large");
  CHECK_THAT(error.what(), Catch::Contains("1000 bytes"));
}

TEST_CASE("a server slower than the grant's timeout gives timeout, on time") {
  mock_server server;
  auto grant = local_grant();
  grant.timeout = 500ms;
  auto start = std::chrono::steady_clock::now();
  auto error = error_of([&] { fetch_url(grant, server.url("/slow?ms=10000")); });
  auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(error.type() == "timeout");
  CHECK_THAT(error.what(), Catch::Contains("500 ms"));
  CHECK(elapsed >= 450ms);
  CHECK(elapsed < 8000ms);  // the server answers after 10 s; slack for a loaded machine
}

TEST_CASE("a port nobody listens on is unavailable") {
  // Bound but not listening: connections to it are refused, and nobody else can take it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0);
  auto where = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  auto error = error_of([&] { fetch_url(local_grant(), "http://" + where + "/"); });
  ::close(fd);
  CHECK(error.type() == "unavailable");
  CHECK_THAT(error.what(), Catch::Contains("could not connect to " + where));
}

TEST_CASE("https to a server that does not speak TLS fails cleanly") {
  mock_server server;
  auto error = error_of([&] { fetch_url(local_grant(), "https://127.0.0.1:" + std::to_string(server.port()) + "/"); });
  CHECK(error.type() == "unavailable");
  CHECK_THAT(error.what(), Catch::Contains("TLS"));
}

TEST_CASE("unusable URLs and arguments are refused with the reason") {
  auto grant = local_grant();
  grant.methods = {"GET", "POST"};
  auto refusal = [&](json args) {
    auto error = error_of([&] { fetch(grant, args); });
    CHECK(error.type() == "refused");
    return std::string(error.what());
  };
  CHECK_THAT(refusal({{"url", "ftp://127.0.0.1/file"}}), Catch::Contains("ftp"));
  CHECK_THAT(refusal({{"url", "http://user:secretpw@127.0.0.1/"}}),
             Catch::Contains("user info") && !Catch::Contains("secretpw"));
  CHECK_THAT(refusal({{"url", "http:///path"}}), Catch::Contains("no host"));
  CHECK_THAT(refusal({{"url", "127.0.0.1/path"}}), Catch::Contains("not an absolute URL"));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1:99999/"}}), Catch::Contains("port"));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1/a b"}}), Catch::Contains("space"));
  // A name is checked and looked up as written: a percent-encoded one is refused, not decoded.
  CHECK_THAT(refusal({{"url", "http://%31%32%37.0.0.1/"}}), Catch::Contains("host"));
  CHECK_THAT(refusal({{"url", "http://[v1.x]/"}}), Catch::Contains("IPvFuture"));
  CHECK_THAT(refusal(json::object()), Catch::Contains("\"url\""));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1/"}, {"headers", {{"Host", "evil"}}}}), Catch::Contains("Host"));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1/"}, {"headers", {{"content-length", "9"}}}}),
             Catch::Contains("content-length"));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1/"}, {"headers", {{"X-A", "1\r\nX-B: 2"}}}}),
             Catch::Contains("line break"));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1/"}, {"body", {{"a", 1}}}}), Catch::Contains("\"body\""));
  CHECK_THAT(refusal({{"url", "http://127.0.0.1/"}, {"timeout", 5}}), Catch::Contains("timeout"));
}

TEST_CASE("GET, HEAD and OPTIONS are idempotent; other methods at most once") {
  auto fetcher = make_http_fetch(local_grant());
  CHECK(fetcher->name() == "http.fetch");
  CHECK(fetcher->kind({{"url", "http://127.0.0.1/"}}) == idempotency::idempotent);
  for (const char* method : {"GET", "HEAD", "OPTIONS", "get"})
    CHECK(fetcher->kind({{"url", "http://127.0.0.1/"}, {"method", method}}) == idempotency::idempotent);
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE", "post"})
    CHECK(fetcher->kind({{"url", "http://127.0.0.1/"}, {"method", method}}) == idempotency::at_most_once);
  CHECK(error_of([&] { fetcher->kind({{"method", 3}}); }).type() == "refused");
}

}  // namespace cairn::engine::test
