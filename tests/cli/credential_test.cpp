// Credentials never enter the sandbox. The host holds an LLM API key (in its
// environment and in its config file) and another secret; an agent that uses
// llm.chat through the host then searches everything it can read for them.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <random>

#include "tests/cairn_cli.hpp"
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

namespace {

namespace fs = std::filesystem;

// A Python agent that prints every byte it can read under its folder's bind,
// and names what it saw in /workspace/seen.txt.
constexpr const char* app_reader = R"(#!/usr/bin/env python3
import os
seen = []
for root, dirs, files in os.walk("/run/cairn/app"):
    for name in files:
        path = os.path.join(root, name)
        seen.append(path)
        try:
            os.write(1, open(path, "rb").read())
        except OSError as e:
            print("unreadable", path, type(e).__name__)
for path in ["/run/cairn/app/.cairn/config.json", "/run/cairn/app/.cairn/cairn.db", "/run/cairn/app/.ssh/id_ed25519",
             "/run/cairn/app/.env"]:
    try:
        os.write(1, open(path, "rb").read())
    except OSError as e:
        print("refused", path, type(e).__name__)
with open("/workspace/seen.txt", "w") as out:
    out.write("\n".join(seen) + "\n")
print("the agent saw", len(seen), "files")
)";

struct app_layout {
  fs::path folder;
  std::string key, ssh_key, dot_env;
};

// The README's layout: the agent in a folder of its own with its module, and
// beside it cairn's default home ./.cairn holding the API key in config.json
// (`mode`), plus a .ssh and a .env of the user's. Owned by `owner`.
app_layout make_app_layout(const fs::path& folder, mode_t mode, uid_t owner) {
  app_layout l{folder, random_secret("sk-app-"), random_secret("ssh-"), random_secret("env-")};
  fs::create_directories(folder / ".cairn");
  fs::create_directories(folder / ".ssh");
  std::ofstream(folder / "agent.py") << app_reader;
  std::ofstream(folder / "helper.py") << "VALUE = 'the agent's own module'\n";
  std::ofstream(folder / ".cairn" / "config.json") << json{{"llm", {{"api_key", l.key}}}}.dump();
  std::ofstream(folder / ".ssh" / "id_ed25519") << l.ssh_key;
  std::ofstream(folder / ".env") << "SECRET=" << l.dot_env << "\n";
  ::chmod((folder / "agent.py").c_str(), 0755);
  ::chmod((folder / ".cairn" / "config.json").c_str(), mode);
  ::chmod((folder / ".ssh").c_str(), 0700);
  ::chmod((folder / ".ssh" / "id_ed25519").c_str(), 0600);
  ::chmod(folder.c_str(), 0755);
  for (const auto& p : {folder, folder / ".cairn", folder / ".ssh", folder / "agent.py", folder / "helper.py",
                        folder / ".cairn" / "config.json", folder / ".ssh" / "id_ed25519", folder / ".env"})
    REQUIRE(::chown(p.c_str(), owner, owner) == 0);
  return l;
}

// Every file under `folder`, whole.
std::string every_byte_under(const fs::path& folder) {
  std::string all;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(folder, ec))
    if (e.is_regular_file() && !e.is_symlink()) all += cairn::testing::slurp(e.path());
  return all;
}

}  // namespace

TEST_CASE("a script agent beside the default ./.cairn reads no key, journal, log or dot-file: as root and as a normal user") {
  const bool root = ::geteuid() == 0;
  for (const bool normal_user : {false, true}) {
    if (normal_user && !root) continue;  // this process is the normal user: the first round was it
    for (const mode_t mode : {mode_t{0600}, mode_t{0644}}) {
      const uid_t owner = normal_user ? 65534 : ::geteuid();
      cairn::testing::temp_dir dir;
      ::chmod(dir.path().c_str(), 0755);  // the sandbox uid (under root) and the normal user pass through
      const auto app = make_app_layout(dir / "project", mode, owner);
      cairn::testing::cli_options o{.cwd = app.folder, .env = {{"HOME", dir.path().string()}}, .unset = {"CAIRN_HOME"}};
      if (normal_user) o.as_user = std::make_pair(uid_t{65534}, gid_t{65534});
      INFO((normal_user ? "as uid 65534" : "as this user") << ", config.json " << std::oct << mode);
      auto r = cairn::testing::run_program(CAIRN_BIN, {"run", "./agent.py", "--id", "reader"}, dir.path(), o);
      INFO(r.out << r.err);
      const fs::path home = app.folder / ".cairn";
      const std::string log = cairn::testing::slurp(home / "logs" / "reader.log");
      INFO("log: " << log);
      // It ran, and read its own files through the bind.
      REQUIRE_THAT(log, Catch::Contains("the agent saw"));
      CHECK_THAT(log, Catch::Contains("the agent's own module"));
      const std::string seen = cairn::testing::slurp(home / "workspaces" / "reader" / "seen.txt");
      CHECK_THAT(seen, Catch::Contains("/run/cairn/app/agent.py"));
      CHECK_THAT(seen, !Catch::Contains("/run/cairn/app/.cairn") && !Catch::Contains("/run/cairn/app/.ssh"));
      // Nothing it could print or write holds a secret: not the log, not the
      // journal, not any workspace.
      const std::string kept = every_byte_under(home / "logs") + every_byte_under(home / "workspaces") +
                               cairn::testing::slurp(home / "cairn.db") + cairn::testing::slurp(home / "cairn.db-wal");
      for (const auto& secret : {app.key, app.ssh_key, app.dot_env}) CHECK(kept.find(secret) == std::string::npos);
      CHECK(r.out.find(app.key) == std::string::npos);
      CHECK(r.err.find(app.key) == std::string::npos);
    }
  }
}

TEST_CASE("a script agent kept in a home folder or a folder every user may write is refused, naming the fix") {
  cairn::testing::temp_dir dir;
  ::chmod(dir.path().c_str(), 0755);
  const auto app = make_app_layout(dir / "project", 0600, ::geteuid());
  auto run = [&](const std::string& id, const std::map<std::string, std::string>& env) {
    return cairn::testing::run_program(CAIRN_BIN, {"run", "./agent.py", "--id", id}, dir.path(),
                                       {.cwd = app.folder, .env = env, .unset = {"CAIRN_HOME"}});
  };
  // The script kept in $HOME: its folder is the home, with ~/.ssh in it.
  auto in_home = run("in-home", {{"HOME", app.folder.string()}});
  INFO(in_home.out << in_home.err);
  CHECK(in_home.code != 0);
  CHECK_THAT(in_home.out + in_home.err, Catch::Contains("is a home folder") && Catch::Contains("folder of their own"));
  CHECK_FALSE(fs::exists(app.folder / ".cairn" / "workspaces" / "in-home" / "seen.txt"));
  // A folder others may write (as /tmp).
  ::chmod(app.folder.c_str(), 01777);
  auto shared = run("shared", {{"HOME", dir.path().string()}});
  INFO(shared.out << shared.err);
  CHECK(shared.code != 0);
  CHECK_THAT(shared.out + shared.err, Catch::Contains("may be written by every user"));
  CHECK_FALSE(fs::exists(app.folder / ".cairn" / "workspaces" / "shared" / "seen.txt"));
}
