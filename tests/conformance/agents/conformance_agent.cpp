// The C++ SDK's conformance agent: every scenario of ../SCENARIOS.md, chosen
// by the input's "scenario". The Python and JavaScript agents beside it do
// the same with their SDKs.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <cairn/cairn.hpp>

using namespace std::chrono_literals;
using cairn::json;

namespace {

void log_effect(const std::string& line) { std::ofstream("/workspace/effects.log", std::ios::app) << line << "\n"; }

int logged(const std::string& line) {
  std::ifstream in("/workspace/effects.log");
  int n = 0;
  for (std::string l; std::getline(in, l);) n += l == line;
  return n;
}

void crash() { ::kill(::getpid(), SIGKILL); }

std::string blob(int i, std::size_t n) {
  std::string s(n, 'a');
  for (std::size_t j = 0; j < n; ++j) s[j] = static_cast<char>(97 + (j * 7 + static_cast<std::size_t>(i)) % 26);
  return s;
}

std::int64_t ms_of(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

json steps(cairn::context& ctx, const json& in) {
  const int n = in.at("n").get<int>();
  const int crash_at = in.value("crash_at", -1);
  std::int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const std::string name = "s" + std::to_string(i);
    sum += ctx.step(name, [&] {
                  log_effect(name);
                  if (i == crash_at && ctx.attempt() == 1) crash();
                  return i * i;
                }).get<std::int64_t>();
  }
  return {{"sum", sum}, {"attempt", ctx.attempt()}};
}

json nondeterminism(cairn::context& ctx) {
  ctx.step("a", [] {
    log_effect("a");
    return 1;
  });
  if (ctx.attempt() == 1) {
    ctx.step("b", [] {
      log_effect("b");
      return 2;
    });
    crash();
  }
  try {
    ctx.step("c", [] {
      log_effect("c");
      return 3;
    });
  } catch (...) {
  }
  return {{"caught", true}};
}

// Attempt 1 is the code before the patches; later attempts, the code after.
json patched(cairn::context& ctx) {
  auto logging_step = [&](const std::string& name, int value) {
    return ctx.step(name, [&] {
      log_effect(name);
      return value;
    });
  };
  logging_step("a", 1);
  if (ctx.attempt() == 1) {
    logging_step("old", 2);
    crash();
  }
  const bool first = ctx.patched("fix-1");
  logging_step(first ? "new" : "old", 2);
  const bool second = ctx.patched("fix-2");
  if (ctx.attempt() == 2) crash();
  return {{"first", first}, {"second", second}, {"attempt", ctx.attempt()}};
}

json workflow(cairn::context& ctx, const json& in) {
  const std::string scenario = in.at("scenario").get<std::string>();
  if (scenario == "steps") return steps(ctx, in);
  if (scenario == "nondeterminism") return nondeterminism(ctx);
  if (scenario == "patched") return patched(ctx);
  if (scenario == "retry") {
    cairn::retry_policy policy{3, 50ms, 2.0, 1000ms, 0ms, 0.0};
    auto value = ctx.step("flaky", [] {
      log_effect("flaky");
      if (logged("flaky") < 3) throw std::runtime_error("transient");
      return std::string("ok");
    }, policy);
    return {{"value", value}};
  }
  if (scenario == "exhausted") {
    try {
      ctx.step("always", []() -> json {
        log_effect("always");
        throw std::runtime_error("always broken");
      }, cairn::retry_policy{2, 10ms, 2.0, 1000ms, 0ms, 0.0});
    } catch (const cairn::step_failed& e) {
      return {{"step", e.step()}, {"message", e.cause()}};
    }
    throw std::logic_error("the step 'always' did not fail");
  }
  if (scenario == "terminal") {
    ctx.step("fatal", []() -> json {
      log_effect("fatal");
      throw cairn::terminal_error("bad input");
    }, cairn::retry_policy{5});
    return nullptr;
  }
  if (scenario == "signals") {
    auto approval = ctx.wait_signal("approval");
    auto absent = ctx.wait_signal("absent", 200ms);
    return {{"approval", approval ? *approval : json()}, {"absent", absent ? *absent : json()}};
  }
  if (scenario == "timers") {
    const auto t0 = ms_of(ctx.now());
    ctx.sleep(300ms);
    const auto t1 = ms_of(ctx.now());
    const double r = ctx.random();
    if (in.value("crash", false) && ctx.attempt() == 1) crash();
    return {{"slept_ms", t1 - t0}, {"now0", t0}, {"random", r}, {"attempt", ctx.attempt()}};
  }
  if (scenario == "children") {
    const std::string agent = in.at("agent").get<std::string>();
    auto h = ctx.start_child(agent, {{"scenario", "steps"}, {"n", 3}});
    json out = ctx.join(h);
    auto g = ctx.start_child(agent, {{"scenario", "terminal"}});
    std::string failed_type;
    try {
      ctx.join(g);
    } catch (const cairn::child_failed& e) {
      failed_type = e.type();
    }
    return {{"child", out}, {"failed_type", failed_type}, {"child_run", h.run_id}};
  }
  if (scenario == "cancel") {
    ctx.step("started", [] { log_effect("started"); });
    int i = 0;
    for (; !ctx.cancelled(); ++i)
      ctx.step("tick" + std::to_string(i), [i] {
        std::this_thread::sleep_for(20ms);
        return i;
      });
    return {{"ticks", i}};
  }
  if (scenario == "large_output") {
    auto value = ctx.step("big", [&] { return blob(0, in.at("bytes").get<std::size_t>()); }).get<std::string>();
    return {{"length", value.size()}, {"head", value.substr(0, 16)}};
  }
  if (scenario == "big_history") {
    const int blobs = in.at("blobs").get<int>();
    const auto bytes = in.at("blob_bytes").get<std::size_t>();
    int verified = 0;
    for (int i = 0; i < blobs; ++i)
      verified += ctx.step("blob" + std::to_string(i), [&] { return blob(i, bytes); }).get<std::string>() == blob(i, bytes);
    if (ctx.attempt() == 1) crash();
    return {{"verified", verified}, {"attempt", ctx.attempt()}};
  }
  if (scenario == "emit") {
    ctx.emit({{"progress", 1}});
    ctx.step("s", [] { return 1; });
    return {{"ok", true}};
  }
  throw cairn::terminal_error("no scenario named '" + scenario + "'");
}

}  // namespace

int main(int argc, char** argv) { return cairn::main(argc, argv, workflow); }
