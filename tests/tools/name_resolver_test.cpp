// Name lookups under a resolver that never answers: calls fail on time with
// a timeout that says so, and the process's threads stay few however many
// calls ask (the audit's 2,541 threads in 8 s).
#include "engine/tools/name_resolver.hpp"

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "engine/tools/http_client.hpp"
#include "tests/tools/mock_server.hpp"

namespace cairn::engine::test {
namespace {

std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A resolver that answers nobody until released; counts the lookups begun.
class silent_resolver {
 public:
  http::lookup_answer lookup(const std::string&) {
    std::unique_lock lock(mutex_);
    ++begun_;
    released_cv_.wait(lock, [&] { return released_; });
    return {{}, "released by the test"};
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    released_cv_.notify_all();
  }
  int begun() {
    std::lock_guard lock(mutex_);
    return begun_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_cv_;
  bool released_ = false;
  int begun_ = 0;
};

// One GET of `url` through `resolver`, whose error it returns.
tool_error fetch_error(http::name_resolver& resolver, const std::string& url, std::chrono::milliseconds timeout) {
  http::options o;
  o.who = "http.fetch";
  o.timeout = timeout;
  o.deadline = std::chrono::steady_clock::now() + timeout;
  o.resolver = &resolver;
  return error_of([&] { http::exchange({"GET", http::parse_url(url), {}, {}}, o); });
}

}  // namespace

TEST_CASE("a resolver that never answers: each call times out on time and the process's threads stay few") {
  silent_resolver silent;
  std::optional<http::name_resolver> resolver(std::in_place, [&](const std::string& h) { return silent.lookup(h); });
  const std::size_t before = thread_count();  // the resolver's threads included
  // As the engine's tool threads call: 8 at once, each call at the shortest
  // timeout a grant may set, every name another.
  constexpr int callers = 8;
  constexpr int calls_each = 25;
  std::atomic<std::size_t> most_threads{0};
  std::mutex m;
  std::vector<std::string> wrong;
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c)
    threads.emplace_back([&, c] {
      for (int i = 0; i < calls_each; ++i) {
        const auto host = fmt::format("n{}-{}.test", c, i);
        const auto start = std::chrono::steady_clock::now();
        auto error = fetch_error(*resolver, "http://" + host + "/", min_network_timeout);
        const auto took = std::chrono::steady_clock::now() - start;
        std::string what = error.what();
        if (error.type() != "timeout" || what.find(host) == std::string::npos ||
            what.find("was not looked up within 100 ms") == std::string::npos || took < min_network_timeout ||
            took > min_network_timeout + 30s) {
          std::lock_guard lock(m);
          wrong.push_back(fmt::format("{} ({} ms): {}", error.type(),
                                      std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), what));
        }
        auto now = thread_count();
        for (auto seen = most_threads.load(); now > seen && !most_threads.compare_exchange_weak(seen, now);) {
        }
      }
    });
  for (auto& t : threads) t.join();
  INFO("threads before: " << before << ", most seen: " << most_threads.load());
  CHECK(wrong.empty());
  if (!wrong.empty()) FAIL_CHECK(wrong.front());
  // The callers' own threads and nothing else: the lookups still hang on the
  // resolver's fixed few (4), which `before` counted.
  CHECK(most_threads.load() <= before + callers);
  CHECK(thread_count() <= before);
  // A lookup whose callers all left before a thread was free is dropped unmade.
  CHECK(silent.begun() == static_cast<int>(http::name_resolver::default_threads));
  silent.release();
  resolver.reset();  // joins its threads: each lookup begun has returned
  CHECK(silent.begun() == static_cast<int>(http::name_resolver::default_threads));
}

TEST_CASE("calls for a name whose lookup is under way wait for that lookup, not another") {
  silent_resolver silent;
  std::optional<http::name_resolver> resolver(std::in_place, [&](const std::string& h) { return silent.lookup(h); });
  for (int i = 0; i < 20; ++i)
    CHECK(fetch_error(*resolver, "http://same.test/", min_network_timeout).type() == "timeout");
  CHECK(silent.begun() == 1);
  silent.release();
  resolver.reset();
}

TEST_CASE("a call reaches the addresses its resolver answered") {
  mock_server server;
  http::name_resolver resolver([](const std::string& host) {
    return host == "svc.test" ? http::lookup_answer{{"127.0.0.1"}, {}} : http::lookup_answer{{}, "unknown name"};
  });
  http::options o;
  o.who = "http.fetch";
  o.timeout = 10s;
  o.deadline = std::chrono::steady_clock::now() + o.timeout;
  o.resolver = &resolver;
  http::exchange answer({"GET", http::parse_url(fmt::format("http://svc.test:{}/echo", server.port())), {}, {}}, o);
  CHECK(answer.status() == 200);
  auto error = fetch_error(resolver, "http://other.test/", 10s);
  CHECK(error.type() == "unavailable");
  CHECK_THAT(error.what(), Catch::Contains("unknown name"));
}

}  // namespace cairn::engine::test
