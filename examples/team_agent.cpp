// A lead agent that splits a task among worker agents and merges what they
// return: fan-out, fan-in. Each worker (worker_agent, in this agent's folder)
// is a child run in its own sandbox; the workers run in parallel while the
// lead waits for them, holding no sandbox once it is suspended.
//
//   ctx.start_child("worker_agent", part)   starts a worker, returns at once
//   ctx.join(handle)                        waits for its output, or throws
//                                           cairn::child_failed
//
// Both are journaled: after a crash or a suspension, replay finds the same
// children (none is started twice) and the outputs already joined.
// A worker that fails does not sink the team: its error is reported in the
// output beside the merged results of the others. Cancelling the lead
// (`cairn cancel`) cancels its unfinished workers too.
//
// input: {"text": "...", "workers": 3, "fail_part": 0, "pause_ms": 0}
//   fail_part: the worker (1-based) told to fail on purpose; 0: none
//   pause_ms:  passed to each worker (a durable pause between its steps)
#include <algorithm>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <cairn/cairn.hpp>

namespace {

using cairn::json;

constexpr const char* sample_text =
    "A durable agent writes every step to its journal before it moves on. When the host crashes the agent "
    "replays its journal and continues where it stopped. A waiting agent holds no sandbox: its journal holds "
    "its place, and a timer or a signal wakes it. Workers run in sandboxes of their own, and the journal of "
    "each worker is its own. The lead waits for its workers, merges their results and reports the failures.";

// `text` cut into `n` runs of consecutive words, as even as the words allow.
std::vector<std::string> split_words(const std::string& text, int n) {
  std::istringstream in(text);
  std::vector<std::string> words{std::istream_iterator<std::string>(in), {}};
  std::vector<std::string> parts;
  const std::size_t per = (words.size() + n - 1) / std::max(n, 1);
  for (std::size_t i = 0; i < words.size(); i += per) {
    std::string part;
    for (std::size_t j = i; j < std::min(words.size(), i + per); ++j) part += (part.empty() ? "" : " ") + words[j];
    parts.push_back(part);
  }
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const std::string text = input.value("text", std::string(sample_text));
    const int workers = std::clamp(input.value("workers", 3), 1, 50);
    const int fail_part = input.value("fail_part", 0);

    json parts = ctx.step("split", [&] { return split_words(text, workers); });

    // Fan-out: start every worker before waiting for any, so they run at once.
    std::vector<cairn::child_handle> team;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const int part = static_cast<int>(i) + 1;
      team.push_back(ctx.start_child("worker_agent", {{"part", part},
                                                      {"text", parts[i]},
                                                      {"fail", part == fail_part},
                                                      {"pause_ms", input.value("pause_ms", 0)}}));
    }

    // Fan-in, in order. A worker that failed throws child_failed here; it is
    // reported, not fatal. (A cancelled worker throws it too, type
    // "child_cancelled".) cairn::cancelled_error is not caught: a cancelled
    // lead stops here.
    json results = json::array(), failed = json::array();
    for (const auto& worker : team) {
      try {
        results.push_back(ctx.join(worker));
      } catch (const cairn::child_failed& e) {
        failed.push_back({{"run", e.run_id()}, {"type", e.type()}, {"error", e.cause()}});
      }
    }

    json merged = ctx.step("merge", [&] {
      std::map<std::string, int> counts;
      int words = 0;
      for (const auto& r : results) {
        words += r["words"].get<int>();
        for (const auto& [w, n] : r["counts"].items()) counts[w] += n.get<int>();
      }
      std::vector<std::pair<std::string, int>> top(counts.begin(), counts.end());
      std::ranges::sort(top, [](const auto& a, const auto& b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
      });
      json most = json::array();
      for (std::size_t i = 0; i < std::min<std::size_t>(top.size(), 3); ++i)
        most.push_back(top[i].first + ": " + std::to_string(top[i].second));
      return json{{"words", words}, {"top", most}};
    });
    return {{"workers", team.size()}, {"merged", results.size()}, {"words", merged["words"]},
            {"top", merged["top"]}, {"failed", failed}};
  });
}
