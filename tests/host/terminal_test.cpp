// Text an agent wrote reaches the operator's terminal escaped: no control
// sequence, bidi control or line separator an agent puts in a step name,
// output, error, emit or signal name gets to the terminal through `cairn
// run`, `resume`, `ls` or `show`, and a step named like a tool shows its kind. Also the model server side of the
// boundary: a hostile reply fails its call alone, the token budget holds
// across a resume.
#include <catch2/catch.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"
#include "tests/tools/mock_server.hpp"

using json = nlohmann::json;

namespace {

struct home {
  cairn::testing::temp_dir dir;
  std::map<std::string, std::string> env{{"CAIRN_HOME", (dir / "cairn").string()}};

  cairn::testing::cli_result run(std::vector<std::string> args) const {
    return cairn::testing::run_program(CAIRN_BIN, std::move(args), dir.path(), {.env = env});
  }
};

// Whether the UTF-8 sequence at text[i] is one of the Trojan Source
// characters: bidi controls (U+061C, U+200E-U+200F, U+202A-U+202E,
// U+2066-U+2069), which reorder what follows them, or the line and
// paragraph separators U+2028-U+2029.
bool bidi_or_separator(const std::string& text, std::size_t i) {
  const auto at = [&](std::size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0; };
  if (at(0) == 0xd8 && at(1) == 0x9c) return true;  // U+061C
  if (at(0) != 0xe2) return false;
  const unsigned char third = at(2);
  if (at(1) == 0x80) return third == 0x8e || third == 0x8f || (third >= 0xa8 && third <= 0xae);
  return at(1) == 0x81 && third >= 0xa6 && third <= 0xa9;
}

// What a terminal acts on: C0 controls but newline, DEL, C1 controls in
// either form (a raw byte 0x80-0x9f, or UTF-8 c2 80-9f), bidi controls and
// line separators. Counted, with the ESC bytes among them.
struct control_bytes {
  std::size_t all = 0, esc = 0;
};

control_bytes controls_in(const std::string& text) {
  control_bytes n;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool c1 = c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    const bool raw_c1 = c >= 0x80 && c <= 0x9f && (i == 0 || static_cast<unsigned char>(text[i - 1]) < 0xc0);
    if ((c < 0x20 && c != '\n') || c == 0x7f || c1 || raw_c1 || bidi_or_separator(text, i)) ++n.all;
    if (c == 0x1b) ++n.esc;
  }
  return n;
}

std::size_t lines_starting_with(const std::string& text, const std::string& prefix) {
  std::size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.starts_with(prefix);
  return n;
}

}  // namespace

TEST_CASE("no control byte, bidi control or line separator an agent wrote reaches the terminal through run, resume, ls or show") {
  home h;
  auto run = h.run({"run", TERMINAL_AGENT_PATH, "--id", "terminal-run", "--input", "{}"});
  INFO(run.out << run.err);
  REQUIRE(run.code == 0);
  auto failed = h.run({"run", TERMINAL_AGENT_PATH, "--id", "terminal-fail", "--input", R"({"fail": true})"});
  CHECK(failed.code == 1);
  auto resumed = h.run({"resume", "terminal-run"});
  auto ls = h.run({"ls"});
  auto show = h.run({"show", "terminal-run"});
  auto show_failed = h.run({"show", "terminal-fail"});
  const std::map<std::string, const cairn::testing::cli_result*> outputs = {
      {"run", &run}, {"run (failed)", &failed}, {"resume", &resumed},
      {"ls", &ls},   {"show", &show},           {"show (failed)", &show_failed}};
  for (const auto& [what, result] : outputs) {
    INFO(what << ":\n" << result->out << result->err);
    CHECK(controls_in(result->out).all == 0);
    CHECK(controls_in(result->err).all == 0);
  }
  // The agent's text is there, visibly escaped.
  CHECK_THAT(run.out, Catch::Contains("\\x1b]52;c;") && Catch::Contains("\\u009b"));
  CHECK_THAT(show.out, Catch::Contains("\\u001b[2J") && Catch::Contains("\\x1b]52;c;"));
  for (const auto* result : {&run, &failed})
    CHECK_THAT(result->out + result->err,
               Catch::Contains("\\u202egnp.exe\\u2066ok\\u2028run terminal-run completed"));
  CHECK_THAT(failed.err, Catch::Contains("failing\\nrun terminal-run completed"));
  // Only cairn's own line says the run completed; the agent's stay inside their fields.
  CHECK(lines_starting_with(run.out, "run terminal-run completed") == 1);
  CHECK(lines_starting_with(show.out + failed.out + failed.err + ls.out, "run terminal-run completed") == 0);
  // A step named send_email shows as a step, not as the tool.
  CHECK_THAT(run.out, Catch::Matches("[\\s\\S]*\\n +1  step +send_email [\\s\\S]*"));
  CHECK_THAT(show.out, Catch::Matches("[\\s\\S]*\\n +1  send_email +step [\\s\\S]*"));
}

TEST_CASE("a model reply nested 300,000 levels deep fails its call alone, and resume does not crash") {
  home h;
  cairn::engine::test::mock_server llm;
  h.env["CAIRN_LLM_BASE_URL"] = llm.url("/deep");
  h.env["CAIRN_LLM_MODEL"] = "mock-model";
  std::ofstream(h.dir / "policy.json") << json{{"tools", {{"llm.chat", {{"stream", false}}}}}}.dump();
  auto run = h.run({"run", LLM_AGENT_PATH, "--id", "deep", "--policy", (h.dir / "policy.json").string(),
                      "--input", "{}", "--json"});
  INFO(run.out << run.err);
  REQUIRE(run.code == 0);
  auto result = json::parse(run.out)["output"]["results"][0];
  CHECK(result["error"] == "bad_output");
  CHECK_THAT(result["message"].get<std::string>(), Catch::Contains("deeper than 64 levels"));
  auto resumed = h.run({"resume", "deep"});
  INFO(resumed.out << resumed.err);
  CHECK(resumed.code == 0);
  CHECK(h.run({"show", "deep"}).code == 0);
}

TEST_CASE("the llm.chat token budget holds across a crash: the resumed run counts what it spent") {
  home h;
  cairn::engine::test::mock_server llm;
  h.env["CAIRN_LLM_BASE_URL"] = llm.url("/v1");
  h.env["CAIRN_LLM_MODEL"] = "mock-model";
  std::ofstream(h.dir / "policy.json") << json{{"tools", {{"llm.chat", {{"max_total_tokens", 10}}}}}}.dump();
  auto run = h.run({"run", LLM_AGENT_PATH, "--id", "budget", "--policy", (h.dir / "policy.json").string(),
                      "--input", R"({"calls": 3, "crash_after_first": true})", "--json"});
  INFO(run.out << run.err);
  REQUIRE(run.code == 0);
  auto results = json::parse(run.out)["output"]["results"];
  // 7 tokens, then 6 (max_tokens lowered to the 3 left), then refused.
  CHECK(results[0]["usage"]["total_tokens"] == 7);
  CHECK(results[1]["usage"]["total_tokens"] == 6);
  CHECK(results[2]["error"] == "refused");
  CHECK_THAT(results[2]["message"].get<std::string>(), Catch::Contains("max_total_tokens is 10"));
  CHECK(llm.requests().size() == 2);
}
