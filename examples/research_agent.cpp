// A research agent: plans, gathers material by running commands inside its
// sandbox, drafts, and writes a report into its workspace (the working
// directory, /workspace in the sandbox). Its "model" is a
// deterministic local function (local_model below) so the example runs
// anywhere; every step is journaled, so a crash at any point resumes here
// without redoing finished work.
//
// input: {"topic": "sqlite wal", "pace_ms": 0}
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <cairn/cairn.hpp>

namespace {

using cairn::json;
namespace fs = std::filesystem;

// Runs a shell command in the sandbox and returns its output (at most 64 KiB).
std::string sh(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run: " + command);
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0 && out.size() < (64u << 10)) out.append(buf.data(), n);
  pclose(p);
  return out;
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;)
    if (w.size() > 1) words.push_back(w);
  return words;
}

// Stands in for an LLM: the same prompt always gives the same answer.
struct local_model {
  static json plan(const std::string& topic) {
    json items = json::array();
    for (const auto& w : words_of(topic)) items.push_back(w);
    items.push_back("overview");
    return {{"topic", topic}, {"items", items},
            {"questions", {"What is " + topic + "?", "Where is it documented on this system?"}}};
  }
  static std::string draft(const json& plan, const json& notes, const std::string& date) {
    std::ostringstream r;
    r << "# Research report: " << plan["topic"].get<std::string>() << "\n\n_" << date << "_\n\n";
    for (const auto& q : plan["questions"]) r << "- " << q.get<std::string>() << "\n";
    r << "\n";
    for (const auto& n : notes) {
      r << "## " << n["item"].get<std::string>() << "\n\n";
      r << n["matches"].size() << " documentation files mention it";
      if (!n["matches"].empty()) r << ", e.g.:\n";
      else r << ".\n";
      for (const auto& m : n["matches"]) r << "  - " << m.get<std::string>() << "\n";
      r << "\n";
    }
    return r.str();
  }
};

void pace(const json& input) {
  auto ms = input.value("pace_ms", 0);
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const std::string topic = input.value("topic", "sqlite wal");
    auto plan = ctx.step("plan", [&] {
      pace(input);
      return local_model::plan(topic);
    });

    json notes = json::array();
    for (const auto& item : plan["items"]) {
      const std::string word = item.get<std::string>();
      notes.push_back(ctx.step("gather " + word, [&] {
        pace(input);
        // Only [a-z0-9] reach the shell.
        std::string safe;
        for (char c : word)
          if (std::isalnum(static_cast<unsigned char>(c))) safe += static_cast<char>(std::tolower(c));
        std::string found = sh("ls /usr/share/doc 2>/dev/null | grep -i -- '" + safe + "' | head -n 5");
        fs::create_directories("notes");
        std::ofstream("notes/" + safe + ".txt") << found;
        json matches = json::array();
        for (const auto& m : words_of(found)) matches.push_back("/usr/share/doc/" + m);
        return json{{"item", word}, {"matches", matches}};
      }));
    }

    auto when = std::chrono::system_clock::to_time_t(ctx.now());
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&when));

    auto draft = ctx.step("draft", [&] {
      pace(input);
      return local_model::draft(plan, notes, date);
    });

    return ctx.step("write report", [&] {
      std::ofstream("report.md") << draft.get<std::string>();
      auto words = words_of(draft.get<std::string>()).size();
      return json{{"report", "/workspace/report.md"}, {"words", words}, {"sections", notes.size()}};
    });
  });
}
