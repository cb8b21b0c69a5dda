// One worker of team_agent: counts the words of its part of the text and
// writes notes about it. Each worker is a run of its own, in its own sandbox,
// with its own journal and workspace (beside its parent's); team_agent starts
// it with ctx.start_child("worker_agent", input) and collects its output with
// ctx.join.
//
// input: {"part": 2, "text": "...", "pause_ms": 0, "fail": false}
//   pause_ms: a durable pause between the two steps (say, a rate limit before
//             the next model call); a long one suspends this run, not its sandbox
//   fail:     fail on purpose, to show how a worker's error reaches the lead
#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <cairn/cairn.hpp>

namespace {

using cairn::json;

// Lowercase words of at least 4 letters with their counts.
std::map<std::string, int> count_words(const std::string& text) {
  std::map<std::string, int> counts;
  std::string word;
  auto flush = [&] {
    if (word.size() >= 4) ++counts[word];
    word.clear();
  };
  for (unsigned char c : text) {
    if (std::isalpha(c)) word += static_cast<char>(std::tolower(c));
    else flush();
  }
  flush();
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const int part = input.value("part", 1);
    const std::string text = input.value("text", std::string());

    json counted = ctx.step("count words", [&] {
      // terminal_error fails the step at once, with no retry: retrying would
      // not change the outcome. The run then fails with this message, and the
      // lead's ctx.join throws child_failed carrying it.
      if (input.value("fail", false))
        throw cairn::terminal_error("part " + std::to_string(part) + " is unreadable (failed on purpose)");
      auto counts = count_words(text);
      int words = 0;
      for (const auto& [w, n] : counts) words += n;
      return json{{"words", words}, {"counts", counts}};
    });

    if (int pause = input.value("pause_ms", 0); pause > 0) ctx.sleep(std::chrono::milliseconds(pause));

    ctx.step("write notes", [&] {
      std::vector<std::pair<std::string, int>> top;
      for (const auto& [w, n] : counted["counts"].items()) top.emplace_back(w, n.get<int>());
      std::ranges::sort(top, [](const auto& a, const auto& b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
      });
      std::ofstream notes("notes.md");
      notes << "# Part " << part << "\n\n" << counted["words"].get<int>() << " words of 4+ letters\n\n";
      for (std::size_t i = 0; i < std::min<std::size_t>(top.size(), 5); ++i)
        notes << "- " << top[i].first << ": " << top[i].second << "\n";
      return json{{"notes", "/workspace/notes.md"}};
    });
    return {{"part", part}, {"words", counted["words"]}, {"counts", counted["counts"]}};
  });
}
