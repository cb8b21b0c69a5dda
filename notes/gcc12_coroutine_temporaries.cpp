// Why cairn builds with clang-15 (CMakeLists.txt): Debian 12's g++ 12.2
// destroys twice a class-type temporary in a co_await expression when the
// awaited coroutine suspends.
//   g++ -std=c++20 -O2 -fsanitize=address gcc12_coroutine_temporaries.cpp   # double free
//   clang++-15 -std=c++20 -O2 -fsanitize=address gcc12_coroutine_temporaries.cpp   # clean
#include <boost/asio.hpp>
#include <iostream>
#include <optional>
namespace asio = boost::asio;
struct S { std::string a = std::string(100, 'x'); };
struct R { std::string id = std::string(60, 'r'); };
asio::awaitable<R> end_run(const std::string& id, int st, S out, S err) {
  auto ex = co_await asio::this_coro::executor; asio::steady_timer t(ex, std::chrono::milliseconds(1)); co_await t.async_wait(asio::use_awaitable);
  co_return R{};
}
asio::awaitable<R> exec(const std::string& id) {
  S result;
  co_await end_run(id, 1, S{}, S{});  // the temporaries S{} are destroyed twice by g++ 12
  co_return R{};
}
asio::awaitable<void> outer() {
  std::string id = "x";
  auto r = co_await exec(id);
  std::cout << "outer done " << r.id.size() << "\n";
}
int main() { asio::io_context io; asio::co_spawn(io, outer(), asio::detached); io.run(); }
