// The engine's test seams the simulator's real-driver mode stands on
// (sim.hpp, --driver real), each alone: blocking work inline
// (engine::run_blocking_inline), tools granted by a test
// (engine::grant_test_tools), and the simulator's way to have an event loop
// run every timer that is due on the fake clock without waiting real time.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "engine/fake_clock.hpp"
#include "engine/io.hpp"
#include "engine/tool_broker.hpp"

using namespace cairn;
using namespace std::chrono_literals;
namespace asio = boost::asio;

TEST_CASE("with blocking work inline, offload and start_slot complete on the caller's thread in one poll") {
  asio::io_context io;
  std::thread::id ran_on;
  bool done = false;
  auto attempt = [&]() -> engine::task<void> {
    auto slot = co_await engine::start_slot::take();
    ran_on = co_await engine::offload([] { return std::this_thread::get_id(); }, engine::pool::starts);
    co_await engine::offload([] {}, engine::pool::tools);
    done = true;
  };

  engine::run_blocking_inline(true);
  asio::co_spawn(io, attempt(), asio::detached);
  io.poll();
  engine::run_blocking_inline(false);
  CHECK(done);
  CHECK(ran_on == std::this_thread::get_id());

  // Off (as in production): the pools' threads.
  CHECK(engine::run_here(engine::offload([] { return std::this_thread::get_id(); }, engine::pool::starts)) !=
        std::this_thread::get_id());
}

namespace {

class counting_tool final : public engine::tool {
 public:
  explicit counting_tool(int& calls) : calls_(calls) {}
  const std::string& name() const override { return name_; }
  engine::idempotency kind(const engine::json&) const override { return engine::idempotency::at_most_once; }
  engine::json call(const engine::tool_call& c) override {
    ++calls_;
    return engine::json{{"seq", c.seq}};
  }

 private:
  int& calls_;
  std::string name_ = "charge";
};

}  // namespace

TEST_CASE("a tool granted by a test is granted by every broker made meanwhile, over the policy's") {
  const std::string run = "r";
  const engine::policy p;  // grants no tool
  protocol::tool_msg m{3, "charge", engine::json::object()};
  int calls = 0;
  engine::grant_test_tools([&] {
    std::map<std::string, std::unique_ptr<engine::tool>> tools;
    tools["charge"] = std::make_unique<counting_tool>(calls);
    return tools;
  });
  {
    engine::tool_broker broker(run, p, std::nullopt, 0, [](const engine::json&) {});
    auto prepared = broker.prepare(m);
    REQUIRE(std::holds_alternative<engine::effects::tool_started>(prepared));
    CHECK(std::get<engine::effects::tool_started>(prepared).idempotency == "at_most_once");
    auto result = broker.perform(m, 0);
    CHECK(result.ok);
    CHECK(result.output == engine::json{{"seq", 3}});
    CHECK(calls == 1);
  }
  engine::grant_test_tools(nullptr);
  engine::tool_broker broker(run, p, std::nullopt, 0, [](const engine::json&) {});
  auto refused = broker.prepare(m);
  REQUIRE(std::holds_alternative<protocol::step_result>(refused));
  CHECK(std::get<protocol::step_result>(refused).error.type == "refused");
}

TEST_CASE("on the fake clock, a timer due at once makes the event loop run every due timer in the next poll") {
  engine::fake_clock clock;
  asio::io_context io;
  engine::timer due(io, engine::clock::now() + 5s);
  bool fired = false;
  due.async_wait([&](boost::system::error_code e) { fired = !e; });
  io.poll();
  CHECK_FALSE(fired);
  clock.advance(5s);
  // Without a nudge the loop hears of it only when its timerfd fires (up to
  // 1 ms of real time: clock_wait_traits); a timer due at once re-arms it now.
  engine::timer nudge(io, engine::clock::time_point{});
  nudge.async_wait([](boost::system::error_code) {});
  io.poll();
  CHECK(fired);
}
