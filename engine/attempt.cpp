#include "engine/attempt.hpp"

#include "engine/crash_point.hpp"
#include "engine/tool_broker.hpp"

#include <optional>

#include <fmt/format.h>

namespace cairn::engine {
namespace {

using namespace std::chrono_literals;
using kind = attempt_result::kind;

// Raised while driving an agent that broke the protocol; the run fails.
struct violation {
  std::string message;
};

// The sandbox ran into a limit and was killed; the attempt ends with `result`.
struct limit_hit {
  attempt_result result;
};

attempt_result failed(std::string message, std::string type) {
  return {kind::failed, nullptr, {std::move(message), std::move(type)}};
}

attempt_result crashed(std::string message) { return {kind::crashed, nullptr, {std::move(message), "crash"}}; }

class attempt_driver {
 public:
  attempt_driver(storage::journal& journal, const storage::run_record& run, const policy& p, int attempt,
                 const engine_options& options, run_observer& observer)
      : journal_(journal),
        run_(run),
        policy_(p),
        attempt_(attempt),
        options_(options),
        observer_(observer),
        tools_(journal, run, p, options.llm, [this](const json& event) { observer_.on_emit(event); }) {}

  attempt_result drive(runtime::sandbox_backend& backend) {
    auto history = journal_.steps(run_.id);
    protocol::start_msg start;
    start.run_id = run_.id;
    start.input = run_.input;
    start.attempt = attempt_;
    for (auto& s : history) start.history.push_back(std::move(s.result));
    expected_seq_ = start.history.size();
    start.next_step_attempt = 1 + failed_attempts_of(expected_seq_);

    runtime::sandbox_spec spec;
    spec.run_id = run_.id;
    spec.workspace = run_.workspace;
    spec.limits = policy_.limits;
    spec.log_file = options_.log_dir / (run_.id + ".log");
    auto box = backend.create(spec);
    for (const auto& warning : box->warnings()) {
      journal_.append_event(run_.id, "sandbox_warning", {{"message", warning}});
      observer_.on_warning(warning);
    }
    process_ = box->exec(run_.agent, {});
    started_ = std::chrono::steady_clock::now();
    crash_point("after_spawn");

    try {
      return converse(start);
    } catch (const violation& v) {
      process_->kill();
      return failed("the agent broke the protocol: " + v.message, "protocol");
    } catch (const protocol::protocol_error& e) {
      process_->kill();
      return failed(std::string("the agent sent a malformed frame: ") + e.what(), "protocol");
    } catch (const runtime::channel_closed& e) {
      return died(e.truncated() ? "closed its channel in the middle of a frame" : "closed its channel");
    } catch (const limit_hit& hit) {
      return hit.result;
    }
  }

 private:
  attempt_result converse(const protocol::start_msg& start) {
    auto first = receive(options_.hello_timeout);
    if (!first) {
      process_->kill();
      return crashed("the agent did not say hello within " + std::to_string(options_.hello_timeout.count()) +
                     " ms" + log_excerpt());
    }
    auto* hello = std::get_if<protocol::hello_msg>(&*first);
    if (!hello) throw violation{"the first message must be hello, got " + std::string(type_name(*first))};
    if (hello->version != protocol::version) {
      std::string why = "the agent speaks protocol v" + std::to_string(hello->version) + " (" + hello->sdk +
                        "); this host speaks v" + std::to_string(protocol::version);
      process_->io().send(protocol::to_json(protocol::host_message{protocol::reject_msg{why}}));
      process_->kill();
      return failed(why, "protocol");
    }
    process_->io().send(protocol::to_json(protocol::host_message{start}));
    crash_point("after_hello");

    for (;;) {
      auto message = receive(200ms);
      enforce_limits();
      if (!message) {
        if (process_->poll_exit()) return died("ended");
        continue;
      }
      if (auto result = handle(*message)) return *result;
    }
  }

  // Ends the attempt (limit_hit) when the sandbox ran into a limit of the
  // policy or outlived its wall-clock time. Checked at most every 200 ms.
  void enforce_limits() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_limit_check_ < 200ms) return;
    last_limit_check_ = now;
    if (auto breach = process_->check_limits()) throw limit_hit{exceeded(breach->message, breach->limit)};
    if (policy_.wall_time.count() > 0 && now - started_ > policy_.wall_time) {
      process_->kill();
      throw limit_hit{exceeded(fmt::format("wall-clock limit exceeded: the attempt ran longer than {} s "
                                           "(limits.wall_seconds in the policy)",
                                           policy_.wall_time.count()),
                               "wall_time")};
    }
  }

  attempt_result exceeded(const std::string& message, const std::string& limit) {
    journal_.append_event(run_.id, "limit_exceeded", {{"limit", limit}, {"message", message}});
    return failed(message, "limit_exceeded");
  }

  // nullopt while the run goes on.
  std::optional<attempt_result> handle(const protocol::agent_message& message) {
    return std::visit(
        [this](const auto& m) -> std::optional<attempt_result> { return on(m); }, message);
  }

  std::optional<attempt_result> on(const protocol::hello_msg&) { throw violation{"a second hello"}; }

  std::optional<attempt_result> on(const protocol::begin_msg& m) {
    check_seq(m.seq, "begin");
    if (m.kind == protocol::step_kind::tool) throw violation{"a begin of kind tool: tool calls are sent as tool"};
    begun_at_ms_ = storage::now_ms();
    return std::nullopt;
  }

  std::optional<attempt_result> on(const protocol::step_msg& m) {
    check_seq(m.result.seq, "step");
    if (m.result.kind == protocol::step_kind::tool) throw violation{"a step of kind tool: only the host records those"};
    storage::step_record record;
    record.run_id = run_.id;
    record.result = m.result;
    record.finished_at_ms = storage::now_ms();
    record.started_at_ms = begun_at_ms_.value_or(record.finished_at_ms - m.result.duration_us / 1000);
    commit(record);
    process_->io().send(protocol::to_json(protocol::host_message{protocol::ack_msg{m.result.seq}}));
    crash_point("after_ack");
    observer_.on_step(record);
    return std::nullopt;
  }

  // The host calls the tool, journals the outcome, then answers.
  std::optional<attempt_result> on(const protocol::tool_msg& m) {
    check_seq(m.seq, "tool");
    storage::step_record record;
    record.run_id = run_.id;
    record.started_at_ms = storage::now_ms();
    record.result = tools_.call(m);
    record.finished_at_ms = storage::now_ms();
    commit(record);
    process_->io().send(protocol::to_json(protocol::host_message{protocol::result_msg{record.result}}));
    crash_point("after_ack");
    observer_.on_step(record);
    return std::nullopt;
  }

  // The answer to the agent goes out only after this returns: the row is durable.
  void commit(const storage::step_record& record) {
    crash_point("before_commit");
    journal_.append_step(record);
    crash_point("after_commit");
    ++expected_seq_;
    begun_at_ms_.reset();
  }

  std::optional<attempt_result> on(const protocol::retry_msg& m) {
    check_seq(m.seq, "retry");
    journal_.append_event(run_.id, "step_retry",
                          {{"name", m.name},
                           {"attempt", m.attempt},
                           {"error", {{"message", m.error.message}, {"type", m.error.type}}},
                           {"delay_ms", m.delay_ms}},
                          m.seq);
    process_->io().send(protocol::to_json(protocol::host_message{protocol::ack_msg{m.seq}}));
    observer_.on_retry(m);
    return std::nullopt;
  }

  std::optional<attempt_result> on(const protocol::emit_msg& m) {
    observer_.on_emit(m.data);
    return std::nullopt;
  }

  std::optional<attempt_result> on(const protocol::done_msg& m) {
    expect_clean_exit("done");
    return attempt_result{kind::completed, m.output, {}};
  }

  std::optional<attempt_result> on(const protocol::fail_msg& m) {
    expect_clean_exit("fail");
    return failed(m.error.message, m.error.type);
  }

  // After done/fail the agent may only close its channel and exit.
  void expect_clean_exit(std::string_view last) {
    auto deadline = std::chrono::steady_clock::now() + options_.exit_grace;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) break;
      try {
        auto extra = process_->io().receive(left);
        if (extra) throw violation{"sent a frame after " + std::string(last)};
      } catch (const runtime::channel_closed&) {
        break;
      }
    }
    // The outcome is known; nothing the sandbox does now can change it.
    process_->kill();
  }

  void check_seq(std::uint64_t seq, std::string_view what) {
    if (seq == expected_seq_) return;
    if (seq < expected_seq_)
      throw violation{std::string(what) + " for seq " + std::to_string(seq) +
                      ", which is already journaled (next is " + std::to_string(expected_seq_) + ")"};
    throw violation{std::string(what) + " for seq " + std::to_string(seq) + " skips ahead (next is " +
                    std::to_string(expected_seq_) + ")"};
  }

  std::optional<protocol::agent_message> receive(std::chrono::milliseconds timeout) {
    auto j = process_->io().receive(timeout);
    if (!j) return std::nullopt;
    return protocol::parse_agent_message(*j);
  }

  // The channel closed or the process ended without done/fail.
  attempt_result died(const std::string& how) {
    auto status = process_->wait_for(options_.exit_grace);
    if (!status) status = process_->kill();
    if (auto breach = process_->check_limits()) return exceeded(breach->message, breach->limit);
    auto tail = process_->log_tail();
    if (auto why = runtime::diagnose_bwrap_failure(tail)) return failed(*why, "sandbox");
    return crashed("the agent " + how + " without finishing (" + status->describe() + ")" + log_excerpt());
  }

  std::string log_excerpt() const {
    auto tail = process_->log_tail(600);
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    if (tail.empty()) return "";
    return "; its last output: " + tail;
  }

  int failed_attempts_of(std::uint64_t seq) {
    int n = 0;
    for (const auto& e : journal_.events(run_.id))
      if (e.kind == "step_retry" && e.seq == seq) ++n;
    return n;
  }

  storage::journal& journal_;
  const storage::run_record& run_;
  const policy& policy_;
  int attempt_;
  const engine_options& options_;
  run_observer& observer_;
  tool_broker tools_;
  std::unique_ptr<runtime::agent_process> process_;
  std::chrono::steady_clock::time_point started_, last_limit_check_;
  std::uint64_t expected_seq_ = 0;
  std::optional<std::int64_t> begun_at_ms_;
};

}  // namespace

attempt_result run_attempt(storage::journal& journal, runtime::sandbox_backend& backend,
                           const storage::run_record& run, const policy& p, int attempt,
                           const engine_options& options, run_observer& observer) {
  attempt_driver driver(journal, run, p, attempt, options, observer);
  return driver.drive(backend);
}

}  // namespace cairn::engine
