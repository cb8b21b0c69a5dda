// A refund that a human must approve: the pattern to copy for any agent that
// proposes something and waits for a person before acting (publish a post,
// pay an invoice, merge a change, send a contract).
//
//   1. It drafts the proposal (a journaled step; a file in /workspace).
//   2. It waits for the signal "approval": `cairn signal RUN approval --data
//      '{"approved": true, "by": "maria", "note": "ok"}'`. While it waits the
//      run holds no process and no sandbox: after a short while the host
//      suspends it (status `waiting`) and wakes it by replay when the signal
//      comes, even if every cairn process was restarted meanwhile.
//   3. Nobody answered in time: it sends a reminder and waits once more; still
//      nothing: the proposal expires and the run ends saying so.
//   4. Approved: after a cool-down (a durable timer; `cairn cancel RUN` still
//      stops the refund during it) it issues the refund. Rejected: it records
//      who rejected it and why.
//
// input: {"order": "A-1042", "customer": "ada@example.com", "amount": 120.0, "currency": "EUR",
//         "reason": "parcel arrived damaged",
//         "approval_timeout_s": 86400,   // each wait for a decision (default 24 h)
//         "reminders": 1,                // reminders before the proposal expires (default 1)
//         "cool_down_s": 600}            // between approval and payout (default 10 min)
//
// Every step appends a line to /workspace/audit.log. A step runs at least
// once: after a crash before its result was journaled it runs again, so a
// step's side effect must be safe to repeat (appending an audit line is).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <cairn/cairn.hpp>

namespace {

using cairn::json;

void audit(const std::string& line) { std::ofstream("audit.log", std::ios::app) << line << "\n"; }

std::string text(const json& object, const char* key, const std::string& otherwise) {
  return object.contains(key) && object[key].is_string() ? object[key].get<std::string>() : otherwise;
}

// What an approver sent. Anyone who can run `cairn signal` can send anything,
// so the payload is checked rather than trusted.
struct decision {
  bool approved = false;
  std::string by, note;
};

std::optional<decision> parse_decision(const json& payload) {
  if (!payload.is_object() || !payload.contains("approved") || !payload["approved"].is_boolean()) return std::nullopt;
  return decision{payload["approved"].get<bool>(), text(payload, "by", "(not given)"), text(payload, "note", "")};
}

json refund(cairn::context& ctx, const json& input) {
  const std::string order = text(input, "order", "A-1042");
  const double amount = input.value("amount", 120.0);
  const std::string currency = text(input, "currency", "EUR");
  const auto window = std::chrono::seconds(input.value("approval_timeout_s", 24 * 3600));
  const int reminders = input.value("reminders", 1);
  const auto cool_down = std::chrono::seconds(input.value("cool_down_s", 600));

  // 1. The proposal. Its result is journaled: on replay (after a suspension
  // or a crash) this returns the same proposal without drafting it again.
  ctx.step("draft proposal", [&] {
    std::ofstream("proposal.md") << "# Refund " << order << "\n\n"
                                 << "- customer: " << text(input, "customer", "(unknown)") << "\n"
                                 << "- amount: " << amount << " " << currency << "\n"
                                 << "- reason: " << text(input, "reason", "(none given)") << "\n";
    audit("drafted proposal.md for " + order);
    return json{{"order", order}, {"amount", amount}, {"currency", currency}, {"proposal", "/workspace/proposal.md"}};
  });
  // emit is live and not journaled: whoever follows the run sees it. It is
  // sent again each time the run wakes before its next journaled call.
  ctx.emit({{"type", "awaiting_approval"}, {"order", order}, {"send", "cairn signal " + ctx.run_id() + " approval"}});

  // 2. and 3. Wait for a decision; remind, then give up. Each wait_signal is
  // journaled with its outcome (the payload, or a timeout), so on replay the
  // loop takes exactly the same path.
  std::optional<decision> verdict;
  int reminded = 0;
  while (!verdict) {
    std::optional<json> payload = ctx.wait_signal("approval", window);
    if (!payload) {
      if (reminded == reminders) break;
      ++reminded;
      ctx.step("remind approvers (" + std::to_string(reminded) + ")", [&] {
        audit("no decision on " + order + " yet: reminder " + std::to_string(reminded) + " sent");
        return json{{"reminder", reminded}};  // a real agent would post to chat or mail here, through a tool
      });
      continue;
    }
    verdict = parse_decision(*payload);
    if (!verdict)  // not a decision: keep waiting (a new window starts)
      ctx.emit({{"type", "ignored_signal"}, {"payload", *payload}, {"why", "expected {\"approved\": true|false}"}});
  }

  if (!verdict) {
    ctx.step("expire proposal", [&] {
      audit("no decision on " + order + " after " + std::to_string(reminders) + " reminder(s): expired");
      return nullptr;
    });
    return {{"status", "expired"}, {"order", order}, {"reminders", reminded}};
  }

  if (!verdict->approved) {
    ctx.step("record rejection", [&] {
      audit("rejected by " + verdict->by + ": " + verdict->note);
      return nullptr;
    });
    return {{"status", "rejected"}, {"order", order}, {"by", verdict->by}, {"note", verdict->note}};
  }

  // 4. A durable timer: longer cool-downs suspend the run like any wait.
  if (cool_down.count() > 0) ctx.sleep(cool_down);
  json issued = ctx.step("issue refund", [&] {
    // A stand-in for the payment: a file in /workspace. For a real payment,
    // call an at-most-once tool here instead (ctx.tool, declared in the
    // policy): the host journals it and never repeats it on a guess.
    std::filesystem::create_directories("refunds");
    json record = {{"order", order}, {"amount", amount}, {"currency", currency}, {"approved_by", verdict->by},
                   {"note", verdict->note}};
    std::ofstream("refunds/" + order + ".json") << record.dump(2) << "\n";
    audit("refund " + order + " issued, approved by " + verdict->by);
    return json{{"refund", "/workspace/refunds/" + order + ".json"}};
  });
  return {{"status", "refunded"}, {"order", order}, {"amount", amount}, {"currency", currency},
          {"approved_by", verdict->by}, {"refund", issued["refund"]}};
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    try {
      return refund(ctx, input);
    } catch (const cairn::cancelled_error& e) {
      // `cairn cancel` reached the agent while its sandbox was alive (a run
      // that is suspended is cancelled without running it at all). Every
      // journaled ctx call throws from now on, so only note it and rethrow:
      // the run ends cancelled whatever this returns.
      audit("cancelled: " + e.reason());
      throw;
    }
  });
}
