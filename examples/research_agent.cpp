// A research agent. Everything that leaves its sandbox goes through the host,
// under the policy in research_agent.policy.json:
//   - it fetches its sources with the http.fetch tool (the sandbox itself has
//     no network; the policy lists the hosts it may reach),
//   - it thinks with the llm.chat tool (the host holds the API key and talks
//     to the model; tokens stream to `cairn run` live),
//   - it mails the report with send_email, a user tool (a host program the
//     policy declares at-most-once: after a crash it is never sent twice),
// and it does its own work (cleaning pages, taking notes, writing the report)
// inside the sandbox, in /workspace. Every step and every tool call is
// journaled: after a crash the run resumes here, and no page is fetched and
// no model call is made twice.
//
// input: {"topic": "SQLite WAL", "sources": ["https://...", ...], "notify": "you@example.com", "pace_ms": 0}
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <cairn/cairn.hpp>

namespace {

using cairn::json;
namespace fs = std::filesystem;

// One chat turn through the host's llm.chat tool; returns the reply text.
std::string ask(cairn::context& ctx, const std::string& system, const std::string& prompt, int max_tokens = 400) {
  json reply = ctx.tool("llm.chat", {{"messages",
                                      {{{"role", "system"}, {"content", system}},
                                       {{"role", "user"}, {"content", prompt}}}},
                                     {"max_tokens", max_tokens}});
  return reply.value("content", "");
}

// The readable text of an HTML page: tags and scripts out, whitespace folded.
std::string text_of(const std::string& html) {
  static const std::regex scripts("<(script|style)[^>]*>[\\s\\S]*?</\\1>", std::regex::icase);
  static const std::regex tags("<[^>]+>");
  static const std::regex space("\\s+");
  std::string text = std::regex_replace(html, scripts, " ");
  text = std::regex_replace(text, tags, " ");
  return std::regex_replace(text, space, " ");
}

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(c));
    else if (!out.empty() && out.back() != '-') out += '-';
  return out.substr(0, 40);
}

void pace(const json& input) {
  auto ms = input.value("pace_ms", 0);
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

constexpr const char* researcher = "You are a careful research assistant. Be brief and concrete.";

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const std::string topic = input.value("topic", "SQLite WAL");
    const json sources = input.value("sources", json::array());

    std::string plan = ask(ctx, researcher, "Plan a short research note on: " + topic +
                                                ". List the three questions it must answer.");

    json notes = json::array();
    for (const auto& source : sources) {
      const std::string url = source.get<std::string>();
      json page;
      try {
        page = ctx.tool("http.fetch", {{"url", url}});
      } catch (const cairn::tool_error& e) {
        // Refused by the policy, or unreachable: the note says so and the run goes on.
        notes.push_back({{"source", url}, {"skipped", e.type() + ": " + e.what()}});
        continue;
      }
      auto cleaned = ctx.step("read " + url, [&] {
        pace(input);
        std::string text = text_of(page.value("body", ""));
        fs::create_directories("sources");
        std::ofstream("sources/" + slug(url) + ".txt") << text;
        return json{{"chars", text.size()}, {"excerpt", text.substr(0, 1500)}};
      });
      std::string summary = ask(ctx, researcher, "Summarize this source for a note on " + topic + " in two "
                                                 "sentences:\n\n" + cleaned["excerpt"].get<std::string>());
      notes.push_back({{"source", url}, {"status", page["status"]}, {"summary", summary}});
    }

    auto when = std::chrono::system_clock::to_time_t(ctx.now());
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&when));

    std::string conclusion = ask(ctx, researcher, "Write the conclusion of a research note on " + topic +
                                                      " from these notes:\n" + notes.dump());

    json report = ctx.step("write report", [&] {
      pace(input);
      std::ostringstream r;
      r << "# " << topic << "\n\n_" << date << "_\n\n## Plan\n\n" << plan << "\n\n## Sources\n\n";
      for (const auto& n : notes) {
        r << "- " << n["source"].get<std::string>() << ": ";
        r << (n.contains("summary") ? n["summary"].get<std::string>() : "(" + n["skipped"].get<std::string>() + ")")
          << "\n";
      }
      r << "\n## Conclusion\n\n" << conclusion << "\n";
      std::ofstream("report.md") << r.str();
      int read = 0;
      for (const auto& n : notes) read += n.contains("summary") ? 1 : 0;
      return json{{"report", "/workspace/report.md"}, {"sources_read", read},
                  {"sources_skipped", static_cast<int>(notes.size()) - read}, {"text", r.str()}};
    });

    json result = {{"report", report["report"]}, {"sources_read", report["sources_read"]},
                   {"sources_skipped", report["sources_skipped"]}};
    if (input.contains("notify")) {
      json sent = ctx.tool("send_email", {{"to", input["notify"]},
                                          {"subject", "Research note: " + topic},
                                          {"body", report["text"]}});
      result["mailed"] = sent["message_id"];
    }
    return result;
  });
}
