// Policies are checked before a run starts: every mistake names its key.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>

#include "engine/policy.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

std::string rejection(const json& j) {
  try {
    engine::parse_policy(j);
  } catch (const engine::policy_error& e) {
    return e.key() + " | " + e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("the default policy grants no tools and no network") {
  auto p = engine::parse_policy(json::object());
  CHECK(p.network == "none");
  CHECK(p.tool_names().empty());
  CHECK_FALSE(p.grants("http.fetch"));
  CHECK(p.limits.max_memory_bytes == engine::default_policy().limits.max_memory_bytes);
  CHECK(p.wall_time.count() > 0);
}

TEST_CASE("a full policy parses and survives its normalized form") {
  json j = {{"network", "none"},
            {"limits", {{"memory_mb", 256}, {"processes", 32}, {"cpu_seconds", 10}, {"wall_seconds", 60},
                        {"open_files", 64}, {"workspace_mb", 64}, {"file_mb", 8}, {"tmp_mb", 16}}},
            {"tools",
             {{"http.fetch", {{"hosts", {"example.com", "*.wikipedia.org", "127.0.0.1:8080", "localhost:*", "[::1]:80"}},
                              {"methods", {"GET"}}, {"private", true}}},
              {"llm.chat", {{"models", {"small"}}, {"max_tokens", 512}, {"images", true}, {"max_total_tokens", 20000}}},
              {"send_email",
               {{"command", {RECORD_TOOL, "--flag"}},
                {"input", {{"to", "string"}, {"cc?", "string"}}},
                {"idempotency", "at_most_once"},
                {"timeout_ms", 5000},
                {"env", {"SMTP_PASSWORD"}}}}}}};
  auto p = engine::parse_policy(j);
  CHECK(p.limits.max_memory_bytes == 256ull << 20);
  CHECK(p.limits.max_processes == 32);
  CHECK(p.limits.max_cpu_seconds == 10);
  CHECK(p.wall_time == std::chrono::seconds(60));
  CHECK(p.limits.max_tmp_bytes == 16ull << 20);
  REQUIRE(p.http_fetch);
  CHECK(p.http_fetch->hosts.size() == 5);
  CHECK(p.http_fetch->private_addresses);
  REQUIRE(p.llm_chat);
  CHECK(p.llm_chat->max_tokens == 512);
  CHECK(p.llm_chat->images);
  CHECK(p.llm_chat->max_total_tokens == 20000);
  REQUIRE(p.commands.count("send_email"));
  CHECK(p.commands["send_email"].env == std::vector<std::string>{"SMTP_PASSWORD"});
  CHECK(p.commands["send_email"].kind == engine::idempotency::at_most_once);
  CHECK(p.tool_names() == std::vector<std::string>{"http.fetch", "llm.chat", "send_email"});

  json normalized = engine::to_json(p);
  CHECK(engine::to_json(engine::parse_policy(normalized)) == normalized);
}

TEST_CASE("unknown keys, wrong types and impossible limits are rejected, naming the key") {
  CHECK_THAT(rejection({{"limit", json::object()}}), Catch::StartsWith("limit | "));
  CHECK_THAT(rejection({{"limits", {{"memory", 5}}}}), Catch::StartsWith("limits.memory | "));
  CHECK_THAT(rejection({{"limits", {{"memory_mb", "lots"}}}}), Catch::Contains("limits.memory_mb") &&
                                                                   Catch::Contains("whole number"));
  CHECK_THAT(rejection({{"limits", {{"memory_mb", 1}}}}), Catch::Contains("limits.memory_mb") &&
                                                              Catch::Contains("impossible"));
  CHECK_THAT(rejection({{"limits", {{"memory_mb", 1ull << 40}}}}), Catch::Contains("limits.memory_mb"));
  CHECK_THAT(rejection({{"limits", {{"processes", -3}}}}), Catch::Contains("limits.processes"));
  CHECK_THAT(rejection({{"limits", {{"memory_mb", 64}, {"tmp_mb", 128}}}}), Catch::Contains("limits.tmp_mb"));
  CHECK_THAT(rejection({{"network", "host"}}), Catch::StartsWith("network | ") && Catch::Contains("http.fetch"));
  CHECK_THAT(rejection({{"tools", {{"http.fetch", json::object()}}}}), Catch::Contains("tools.http.fetch.hosts"));
  CHECK_THAT(rejection({{"tools", {{"http.fetch", {{"hosts", {"https://example.com/x"}}}}}}}),
             Catch::Contains("not a host pattern"));
  CHECK_THAT(rejection({{"tools", {{"http.fetch", {{"hosts", {"a.com"}}, {"methods", {"STEAL"}}}}}}}),
             Catch::Contains("tools.http.fetch.methods"));
  CHECK_THAT(rejection({{"tools", {{"llm.chat", {{"max_tokens", 0}}}}}}), Catch::Contains("tools.llm.chat.max_tokens"));
  // Shorter than a name lookup and a connection: such calls only churn.
  CHECK_THAT(rejection({{"tools", {{"http.fetch", {{"hosts", {"a.com"}}, {"timeout_ms", 1}}}}}}),
             Catch::Contains("tools.http.fetch.timeout_ms") && Catch::Contains("between 100 and"));
  CHECK_THAT(rejection({{"tools", {{"llm.chat", {{"timeout_ms", 99}}}}}}),
             Catch::Contains("tools.llm.chat.timeout_ms") && Catch::Contains("between 100 and"));
  CHECK(engine::parse_policy({{"tools", {{"http.fetch", {{"hosts", {"a.com"}}, {"timeout_ms", 100}}}}}})
            .http_fetch->timeout == std::chrono::milliseconds(100));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"timeout_ms", 5}}}}}}), Catch::Contains("tools.mailer") &&
                                                                           Catch::Contains("command"));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"command", {RECORD_TOOL}}}}}}}),
             Catch::Contains("tools.mailer.idempotency") && Catch::Contains("at_most_once"));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"command", {"tools/record_tool.sh"}}, {"idempotency", "idempotent"}}}}}}),
             Catch::Contains("absolute path"));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"command", {"/nonexistent/tool"}}, {"idempotency", "idempotent"}}}}}}),
             Catch::Contains("not an executable"));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"command", {RECORD_TOOL}}, {"idempotency", "idempotent"},
                                               {"input", {{"to", "text"}}}}}}}}),
             Catch::Contains("tools.mailer.input.to"));
  CHECK_THAT(rejection({{"tools", {{"Bad Name", {{"command", {RECORD_TOOL}}}}}}}), Catch::Contains("tool name"));
  CHECK_THAT(rejection({{"tools", {{"http.fetch", {{"hosts", {"a.com"}}, {"private", "yes"}}}}}}),
             Catch::Contains("tools.http.fetch.private"));
  CHECK_THAT(rejection({{"tools", {{"llm.chat", {{"images", 1}}}}}}), Catch::Contains("tools.llm.chat.images"));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"command", {RECORD_TOOL}}, {"idempotency", "idempotent"},
                                               {"env", {"CAIRN_IDEMPOTENCY_KEY"}}}}}}}),
             Catch::Contains("tools.mailer.env"));
  CHECK_THAT(rejection({{"tools", {{"mailer", {{"command", {RECORD_TOOL}}, {"idempotency", "idempotent"},
                                               {"env", {"A=B"}}}}}}}),
             Catch::Contains("tools.mailer.env"));
  CHECK_THAT(rejection(json::array()), Catch::Contains("JSON object"));
}

TEST_CASE("a host pattern, tool name or variable name a million characters long is refused in a short message") {
  // Each is matched by std::regex, which recurses once a character: such a
  // text overflowed the stack (a stored policy too, whoever wrote it).
  const std::string huge(1'000'000, 'a');
  const auto refused = [](const json& policy, const std::string& key) {
    const std::string message = rejection(policy);
    INFO(message.substr(0, 200));
    CHECK(message.starts_with(key + " | "));
    CHECK(message.size() < 300);
  };
  refused({{"tools", {{"http.fetch", {{"hosts", {huge}}}}}}}, "tools.http.fetch.hosts");
  refused({{"tools", {{huge, {{"command", {RECORD_TOOL}}}}}}}, "tools");
  refused({{"tools", {{"mailer", {{"command", {RECORD_TOOL}}, {"idempotency", "idempotent"}, {"env", {huge}}}}}}},
          "tools.mailer.env");
}

TEST_CASE("a policy file that is not JSON names the file") {
  testing::temp_dir dir;
  std::ofstream(dir / "p.json") << "{ not json";
  try {
    engine::load_policy_file(dir / "p.json");
    FAIL("accepted");
  } catch (const engine::policy_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("p.json") && Catch::Contains("not valid JSON"));
  }
  std::ofstream(dir / "q.json") << R"({"limits": {"memroy_mb": 5}})";
  try {
    engine::load_policy_file(dir / "q.json");
    FAIL("accepted");
  } catch (const engine::policy_error& e) {
    CHECK(e.key() == "limits.memroy_mb");
    CHECK_THAT(e.what(), Catch::Contains("q.json"));
  }
}

TEST_CASE("a policy file over 1 MiB is refused, and one just under is read whole") {
  testing::temp_dir dir;
  // Valid JSON either way: only the size decides. `pad` spaces inside the object.
  const auto policy_of_size = [&](const char* name, std::size_t bytes) {
    const std::string body = R"({"limits": {"memory_mb": 64}})";
    std::ofstream(dir / name) << body.substr(0, 1) << std::string(bytes - body.size(), ' ') << body.substr(1);
    return dir / name;
  };
  try {
    engine::load_policy_file(policy_of_size("big.json", (1 << 20) + 1));
    FAIL("accepted");
  } catch (const engine::policy_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("big.json") && Catch::Contains("larger than 1024 KiB"));
  }
  CHECK(engine::load_policy_file(policy_of_size("fits.json", 1 << 20)).limits.max_memory_bytes == 64ull << 20);
}

TEST_CASE("a user tool's program may be named relative to its policy file") {
  testing::temp_dir dir;
  std::filesystem::create_directories(dir / "tools");
  std::filesystem::copy_file(RECORD_TOOL, dir / "tools" / "mailer.sh");
  std::ofstream(dir / "p.json") << R"({"tools": {"mailer": {"command": ["tools/mailer.sh", "--fast"],
                                                             "idempotency": "at_most_once"}}})";
  auto p = engine::load_policy_file(dir / "p.json");
  CHECK(p.commands.at("mailer").command ==
        std::vector<std::string>{(dir / "tools" / "mailer.sh").string(), "--fast"});
}

TEST_CASE("timeouts, retry and children are parsed strictly, naming the key") {
  CHECK_THAT(rejection({{"timeouts", 5}}), Catch::StartsWith("timeouts | ") && Catch::Contains("JSON object"));
  CHECK_THAT(rejection({{"timeouts", {{"run", 5}}}}), Catch::StartsWith("timeouts.run | "));
  CHECK_THAT(rejection({{"timeouts", {{"step_seconds", "10"}}}}),
             Catch::StartsWith("timeouts.step_seconds | ") && Catch::Contains("whole number"));
  CHECK_THAT(rejection({{"timeouts", {{"run_seconds", -1}}}}), Catch::StartsWith("timeouts.run_seconds | "));
  CHECK_THAT(rejection({{"timeouts", {{"cancel_grace_seconds", 7200}}}}),
             Catch::StartsWith("timeouts.cancel_grace_seconds | ") && Catch::Contains("impossible"));
  CHECK_THAT(rejection({{"retry", {{"backoff", 1}}}}), Catch::StartsWith("retry.backoff | "));
  CHECK_THAT(rejection({{"retry", {{"jitter", 1.5}}}}), Catch::StartsWith("retry.jitter | "));
  CHECK_THAT(rejection({{"retry", {{"jitter", "some"}}}}), Catch::StartsWith("retry.jitter | "));
  CHECK_THAT(rejection({{"retry", {{"multiplier", 0.5}}}}), Catch::StartsWith("retry.multiplier | "));
  CHECK_THAT(rejection({{"retry", {{"initial_ms", 500}, {"max_ms", 100}}}}),
             Catch::StartsWith("retry.max_ms | ") && Catch::Contains("initial_ms"));
  CHECK_THAT(rejection({{"children", {{"max", -1}}}}), Catch::StartsWith("children.max | "));
  CHECK_THAT(rejection({{"children", {{"agent", json::array()}}}}), Catch::StartsWith("children.agent | "));
  CHECK_THAT(rejection({{"children", {{"agents", {"agents/helper"}}}}}),
             Catch::StartsWith("children.agents | ") && Catch::Contains("absolute path"));
  CHECK_THAT(rejection({{"children", {{"agents", "/bin/true"}}}}), Catch::StartsWith("children.agents | "));
}

TEST_CASE("timeouts, retry and children have defaults and survive the normalized form") {
  auto d = engine::parse_policy(json::object());
  CHECK(d.timeouts.run.count() == 0);
  CHECK(d.timeouts.step.count() == 0);
  CHECK(d.timeouts.cancel_grace == std::chrono::seconds(10));
  CHECK(d.retry.initial == std::chrono::milliseconds(200));
  CHECK(d.retry.step_attempts == 10);
  CHECK(d.children.max == 100);
  CHECK(d.children.max_depth == 4);
  CHECK(d.children.agents.empty());
  CHECK(d.run_wall_time == std::chrono::seconds(86'400));

  json j = {{"timeouts", {{"run_seconds", 60}, {"step_seconds", 5}, {"cancel_grace_seconds", 2}}},
            {"retry", {{"initial_ms", 100}, {"multiplier", 3}, {"max_ms", 5000}, {"jitter", 0.5}, {"step_attempts", 4}}},
            {"children", {{"max", 4}, {"max_depth", 2}, {"agents", {"/usr/lib/agents/helper"}}}}};
  auto p = engine::parse_policy(j);
  CHECK(p.timeouts.run == std::chrono::seconds(60));
  CHECK(p.timeouts.step == std::chrono::seconds(5));
  CHECK(p.timeouts.cancel_grace == std::chrono::seconds(2));
  CHECK(p.retry.initial == std::chrono::milliseconds(100));
  CHECK(p.retry.multiplier == 3.0);
  CHECK(p.retry.max == std::chrono::milliseconds(5000));
  CHECK(p.retry.jitter == 0.5);
  CHECK(p.retry.step_attempts == 4);
  CHECK(p.children.max == 4);
  CHECK(p.children.max_depth == 2);
  CHECK(p.children.agents == std::vector<std::string>{"/usr/lib/agents/helper"});

  json normalized = engine::to_json(p);
  CHECK(normalized["timeouts"] == j["timeouts"]);
  CHECK(normalized["retry"] == j["retry"]);
  CHECK(normalized["children"] == j["children"]);
  CHECK(engine::to_json(engine::parse_policy(normalized)) == normalized);
}

TEST_CASE("a children.agents path is taken relative to its policy file") {
  testing::temp_dir dir;
  std::ofstream(dir / "p.json") << R"({"children": {"agents": ["agents/helper"]}})";
  auto p = engine::load_policy_file(dir / "p.json");
  CHECK(p.children.agents == std::vector<std::string>{(dir / "agents" / "helper").string()});
}

TEST_CASE("the run retry delay grows by its multiplier, stays within its jitter and respects max") {
  engine::run_retry r;
  r.initial = std::chrono::milliseconds(1000);
  r.multiplier = 2.0;
  r.max = std::chrono::milliseconds(5000);
  r.jitter = 0.25;
  for (int crashes = 1; crashes <= 6; ++crashes) {
    const std::int64_t full = std::min<std::int64_t>(1000 << (crashes - 1), 5000);
    std::set<std::int64_t> seen;
    for (int i = 0; i < 200; ++i) {
      const auto d = r.delay_after(crashes).count();
      CHECK(d >= full * 3 / 4);
      CHECK(d <= full);
      seen.insert(d);
    }
    CHECK(seen.size() > 1);  // the jitter spreads runs that crashed together
  }
  r.jitter = 0;
  CHECK(r.delay_after(1) == std::chrono::milliseconds(1000));
  CHECK(r.delay_after(3) == std::chrono::milliseconds(4000));
  CHECK(r.delay_after(10) == std::chrono::milliseconds(5000));
}
