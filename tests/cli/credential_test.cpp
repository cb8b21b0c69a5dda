// Credentials never enter the sandbox. The host holds an LLM API key (in its
// environment and in its config file) and another secret; an agent that uses
// llm.chat through the host then searches everything it can read for them.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "tests/temp_dir.hpp"
#include "tests/tools/mock_server.hpp"

using json = nlohmann::json;

namespace {

std::string random_secret(const std::string& prefix) {
  std::random_device rd;
  return prefix + std::to_string(rd()) + std::to_string(rd());
}

std::string reversed(std::string s) { return {s.rbegin(), s.rend()}; }

// Runs cairn with exactly `env` as its environment; returns {exit code, stdout+stderr}.
std::pair<int, std::string> run_cairn(const std::filesystem::path& home, const std::vector<std::string>& env,
                                      const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    int log = open((home / "cli.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<std::string> argv{CAIRN_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> e = env;
    for (auto& v : e) cenv.push_back(v.data());
    cenv.push_back(nullptr);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, cairn::engine::test::slurp(home / "cli.log")};
}

}  // namespace

TEST_CASE("no secret of the host can be found from inside the sandbox, while the host uses them") {
  cairn::testing::temp_dir home;
  const std::string env_key = random_secret("sk-env-");
  const std::string config_key = random_secret("sk-config-");
  const std::string other = random_secret("db-password-");
  cairn::engine::test::mock_server llm({"--require-key", env_key});

  std::ofstream(home / "config.json") << json{{"llm", {{"api_key", config_key}, {"model", "mock-1"}}}}.dump();
  std::ofstream(home / "policy.json") << json{{"tools", {{"llm.chat", json::object()}}}}.dump();
  const json input = {{"secrets_reversed", {reversed(env_key), reversed(config_key), reversed(other)}}};
  const std::vector<std::string> env = {
      "PATH=/usr/bin:/bin", "CAIRN_HOME=" + home.path().string(),
      "CAIRN_LLM_BASE_URL=http://127.0.0.1:" + std::to_string(llm.port()) + "/v1", "CAIRN_LLM_API_KEY=" + env_key,
      "MY_DB_PASSWORD=" + other};

  auto [code, out] = run_cairn(home.path(), env,
                               {"run", SECRET_HUNTER, "--id", "hunt", "--policy", (home / "policy.json").string(),
                                "--input", input.dump(), "--json"});
  INFO(out);
  REQUIRE(code == 0);
  json run = json::parse(out.substr(out.find('{')));
  const json& result = run["output"];
  // The host used the key: the mock answers only with the right one.
  CHECK(result["llm"].contains("content"));
  CHECK(result["found"] == json::array());
  CHECK(result["files_scanned"].get<int>() > 20);
  CHECK(result["proc_entries_scanned"].get<int>() > 3);

  // Nor did any secret reach what the host keeps of the run.
  for (const auto& file : {home / "cairn.db", home / "logs" / "hunt.log"}) {
    std::string bytes = cairn::engine::test::slurp(file);
    CHECK(bytes.find(env_key) == std::string::npos);
    CHECK(bytes.find(config_key) == std::string::npos);
    CHECK(bytes.find(other) == std::string::npos);
  }
}

TEST_CASE("a key kept only in the host's config file is used by the host and stays there") {
  cairn::testing::temp_dir home;
  const std::string config_key = random_secret("sk-config-");
  cairn::engine::test::mock_server llm({"--require-key", config_key});
  std::ofstream(home / "config.json")
      << json{{"llm", {{"api_key", config_key}, {"model", "mock-1"},
                       {"base_url", "http://127.0.0.1:" + std::to_string(llm.port()) + "/v1"}}}}
             .dump();
  std::ofstream(home / "policy.json") << json{{"tools", {{"llm.chat", json::object()}}}}.dump();
  const json input = {{"secrets_reversed", {reversed(config_key)}}};
  auto [code, out] = run_cairn(home.path(), {"PATH=/usr/bin:/bin", "CAIRN_HOME=" + home.path().string()},
                               {"run", SECRET_HUNTER, "--id", "hunt2", "--policy", (home / "policy.json").string(),
                                "--input", input.dump(), "--json"});
  INFO(out);
  REQUIRE(code == 0);
  json run = json::parse(out.substr(out.find('{')));
  CHECK(run["output"]["llm"].contains("content"));
  CHECK(run["output"]["found"] == json::array());
}
