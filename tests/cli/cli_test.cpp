// The `cairn` command as users and scripts see it: exit codes, messages, --json.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include "tests/capabilities.hpp"
#include "tests/temp_dir.hpp"

using json = nlohmann::json;

namespace {

struct result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs cairn in `dir` with CAIRN_HOME=dir/.cairn; `path_env` replaces PATH
// when given; `uid` runs it as that user, from a copy of the binary in `dir`
// (the build tree may be closed to other users, e.g. under /root).
// `program`: runs that instead of cairn, with `args` (which then name cairn).
result run_cli(const cairn::testing::temp_dir& dir, std::vector<std::string> args, const char* path_env = nullptr,
             uid_t uid = 0, const char* program = CAIRN_BIN) {
  std::string binary = program;
  if (uid != 0) {
    binary = (dir / "cairn").string();
    std::filesystem::copy_file(CAIRN_BIN, binary, std::filesystem::copy_options::skip_existing);
  }
  args.insert(args.begin(), binary);
  pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.path().c_str()) != 0) _exit(126);
    setenv("CAIRN_HOME", (dir.path() / ".cairn").c_str(), 1);
    if (path_env) setenv("PATH", path_env, 1);
    int out = open((dir.path() / "stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int err = open((dir.path() / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    dup2(out, 1);
    dup2(err, 2);
    if (uid != 0 && (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)) _exit(125);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(dir / "stdout"),
          slurp(dir / "stderr")};
}

std::vector<std::string> run_steps(const std::string& id, int steps, const std::string& agent = STEP_AGENT) {
  return {"run", agent, "--id", id, "--input", json{{"steps", steps}}.dump()};
}

}  // namespace

TEST_CASE("cairn run shows each step, exits 0, and show --json has the journal") {
  cairn::testing::temp_dir dir;
  auto r = run_cli(dir, run_steps("r1", 3));
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("  0  step   step 0"));
  CHECK_THAT(r.out, Catch::Contains("  2  step   step 2"));
  CHECK_THAT(r.out, Catch::Contains("run r1 completed"));

  auto show = run_cli(dir, {"show", "r1", "--json"});
  REQUIRE(show.code == 0);
  auto j = json::parse(show.out);
  CHECK(j["run"]["status"] == "completed");
  REQUIRE(j["steps"].size() == 3);
  for (const auto& s : j["steps"]) {
    CHECK(s.contains("seq"));
    CHECK(s["status"] == "ok");
    CHECK(s["attempt"] == 1);
    CHECK(s.contains("duration_us"));
    CHECK(s["output"].contains("nonce"));
  }
  // Written as it is read, it is one document all the same, with every event and the kept state.
  std::vector<std::string> kinds;
  for (const auto& e : j["events"]) kinds.push_back(e["kind"]);
  CHECK(kinds.front() == "attempt_started");
  CHECK(kinds.back() == "run_completed");
  CHECK(j["state"].is_object());
  CHECK(j["journal_bytes"].get<std::uint64_t>() > 0);

  auto text = run_cli(dir, {"show", "r1"});
  CHECK_THAT(text.out, Catch::Contains("SEQ  NAME"));
  CHECK_THAT(text.out, Catch::Contains("step 1"));
  CHECK_THAT(text.out, Catch::Contains("0 suspensions in the last hour"));

  auto ls = run_cli(dir, {"ls", "--json"});
  REQUIRE(ls.code == 0);
  CHECK(json::parse(ls.out)[0]["id"] == "r1");

  auto again = run_cli(dir, run_steps("r1", 3));
  CHECK(again.code == 0);
  CHECK_THAT(again.out, Catch::Contains("already exists"));
}

TEST_CASE("cairn logs: an ended run's steps and its agent's output, escaped and bounded; --tail; --json by line") {
  cairn::testing::temp_dir dir;
  // Output that would retitle and clear a terminal, and a 1 MiB line.
  const std::string hostile = "hi \x1b]0;pwned\x07\x1b[2J\xc2\x9b";
  auto r = run_cli(dir, {"run", STEP_AGENT, "--id", "lg", "--input",
                         json{{"steps", 3}, {"print", hostile}, {"long_line_bytes", 1 << 20}}.dump()});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);

  auto logs = run_cli(dir, {"logs", "lg"});
  INFO(logs.out << logs.err);
  CHECK(logs.code == 0);
  for (int i = 0; i < 3; ++i) {
    const auto n = std::to_string(i);
    CHECK_THAT(logs.out, Catch::Contains("  " + n + "  step   step " + n));
    CHECK_THAT(logs.out, Catch::Contains("  | hi \\x1b]0;pwned\\x07\\x1b[2J\\u009b " + n + "\n"));
  }
  CHECK(logs.out.find('\x1b') == std::string::npos);
  CHECK(logs.out.find("\xc2\x9b") == std::string::npos);
  CHECK_THAT(logs.out, Catch::Contains("more bytes of this line]"));
  CHECK(logs.out.size() < 64 * 1024);  // the 1 MiB line is cut, not printed
  CHECK_THAT(logs.out, Catch::Contains("run lg completed"));
  // The journal first, then the agent's output.
  CHECK(logs.out.find("step 2") < logs.out.find("  | "));

  auto tail = run_cli(dir, {"logs", "lg", "--tail", "1"});
  CHECK(tail.code == 0);
  CHECK_THAT(tail.out, Catch::Contains("  2  step   step 2"));
  CHECK_THAT(tail.out, !Catch::Contains("step 1"));
  CHECK_THAT(tail.out, Catch::Contains("pwned\\x07\\x1b[2J\\u009b 2\n"));
  CHECK_THAT(tail.out, !Catch::Contains("pwned\\x07\\x1b[2J\\u009b 1\n"));

  auto as_json = run_cli(dir, {"logs", "lg", "--json"});
  REQUIRE(as_json.code == 0);
  std::map<std::string, int> types;
  std::istringstream lines(as_json.out);
  json last;
  for (std::string line; std::getline(lines, line);) {
    last = json::parse(line);  // each line one object
    ++types[last.at("type").get<std::string>()];
    if (last["type"] == "output" && last["line"].get<std::string>().starts_with("hi"))
      CHECK(last["line"].get<std::string>().starts_with(hostile));  // the bytes, for a program to read
  }
  CHECK(types["step"] == 3);
  CHECK(types["output"] == 4);
  CHECK(last["type"] == "end");
  CHECK(last["run"]["status"] == "completed");

  auto unknown = run_cli(dir, {"logs", "nobody"});
  CHECK(unknown.code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("no run 'nobody'"));

  // A link planted at the log's path is not followed.
  const auto log = dir / ".cairn" / "logs" / "lg.log";
  std::ofstream(dir / "secret") << "SECRET\n";
  std::filesystem::remove(log);
  std::filesystem::create_symlink(dir / "secret", log);
  auto planted = run_cli(dir, {"logs", "lg"});
  INFO(planted.out << planted.err);
  CHECK(planted.code == 0);
  CHECK_THAT(planted.out + planted.err, !Catch::Contains("SECRET"));
  CHECK_THAT(planted.out, Catch::Contains("not a regular file"));

  // A run whose workspace (and so its log) is on another host: its journal, and where its output is.
  std::filesystem::remove(log);
  SQLite::Database(dir / ".cairn" / "cairn.db", SQLite::OPEN_READWRITE)
      .exec("UPDATE runs SET workspace_host = 'far-host' WHERE id = 'lg'");
  auto elsewhere = run_cli(dir, {"logs", "lg"});
  INFO(elsewhere.out << elsewhere.err);
  CHECK(elsewhere.code == 0);
  CHECK_THAT(elsewhere.out, Catch::Contains("  2  step   step 2"));
  CHECK_THAT(elsewhere.out, Catch::Contains("the agent's output of run lg is on far-host"));
}

TEST_CASE("a failed run exits 1 with its error on stderr") {
  cairn::testing::temp_dir dir;
  auto r = run_cli(dir, {"run", STEP_AGENT, "--id", "bad", "--input", R"({"steps":3,"terminal_at":1})"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("run bad failed: step 'step 1' failed: step 1 cannot succeed"));
  // and where to look next: the agent's own output, which says it too.
  const auto log = dir / ".cairn" / "logs" / "bad.log";
  CHECK_THAT(r.err, Catch::Contains("its agent's output: " + log.string()));
  CHECK_THAT(slurp(log), Catch::Contains("step 1 cannot succeed"));
}

TEST_CASE("bad input is refused before anything is written") {
  cairn::testing::temp_dir dir;
  auto r = run_cli(dir, {"run", STEP_AGENT, "--input", "{not json"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--input is not valid JSON"));
  auto missing = run_cli(dir, {"run", "./no-such-agent"});
  CHECK(missing.code == 2);
  CHECK_THAT(missing.err, Catch::Contains("agent program './no-such-agent' not found"));
  CHECK_FALSE(std::filesystem::exists(dir / ".cairn" / "cairn.db"));
  auto nothing = run_cli(dir, {"resume", "ghost"});
  CHECK(nothing.code != 0);
}

TEST_CASE("--db is taken before or after the subcommand, and a usage error says where the usage is") {
  cairn::testing::temp_dir dir;
  auto after = run_cli(dir, {"run", STEP_AGENT, "--id", "a", "--input", R"({"steps":1})", "--db", "after.db"});
  INFO(after.err);
  CHECK(after.code == 0);
  auto before = run_cli(dir, {"--db", "after.db", "ls", "--json"});
  CHECK(json::parse(before.out).size() == 1);
  auto listed = run_cli(dir, {"ls", "--db", "after.db", "--json"});
  CHECK(json::parse(listed.out) == json::parse(before.out));
  CHECK_FALSE(std::filesystem::exists(dir / ".cairn" / "cairn.db"));  // the default journal was never used

  auto usage = run_cli(dir, {"show"});
  CHECK(usage.code == 2);
  CHECK_THAT(usage.err, Catch::Contains("run is required") && Catch::Contains("Run 'cairn show --help'"));
}

TEST_CASE("without bwrap, run and doctor say so and how to fix it, and never run unsandboxed") {
  cairn::testing::temp_dir dir;
  auto r = run_cli(dir, run_steps("nobwrap", 2), "/nonexistent");
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("bwrap"));
  CHECK_THAT(r.err, Catch::Contains("apt-get install bubblewrap"));
  CHECK_FALSE(std::filesystem::exists(dir / ".cairn" / "workspaces" / "nobwrap" / "exec.log"));

  auto doctor = run_cli(dir, {"doctor"}, "/nonexistent");
  CHECK(doctor.code == 3);
  CHECK_THAT(doctor.out, Catch::Contains("FAIL"));
  CHECK_THAT(doctor.out, Catch::Contains("apt-get install bubblewrap"));

  // Once bwrap is back, the same run resumes.
  auto resumed = run_cli(dir, {"resume", "nobwrap"});
  INFO(resumed.err);
  CHECK(resumed.code == 0);
}

TEST_CASE("without libpq, a PostgreSQL journal says what to install and a SQLite journal works as before") {
  if (!cairn::testing::require_capability("root", ::geteuid() == 0,
                                          "only root can hide libpq in a mount namespace of its own"))
    return;
  // The file the dynamic loader finds for libpq.so.5, hidden below by an empty one.
  void* libpq = ::dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(libpq != nullptr);
  Dl_info found{};
  REQUIRE(::dladdr(::dlsym(libpq, "PQping"), &found) != 0);
  const std::string library = std::filesystem::canonical(found.dli_fname).string();
  cairn::testing::temp_dir dir;
  const auto without_libpq = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"-m", "/bin/sh", "-c", R"(mount --bind /dev/null "$0" && exec "$@")", library,
                               CAIRN_BIN});
    return run_cli(dir, args, nullptr, 0, "/usr/bin/unshare");
  };
  auto pg = without_libpq({"ls", "--db", "postgresql://cairn@127.0.0.1:1/nothing"});
  CHECK(pg.code == 3);
  CHECK_THAT(pg.err, Catch::Contains("libpq") && Catch::Contains("apt-get install libpq5"));
  auto sqlite = without_libpq(run_steps("no-libpq", 2));
  INFO(sqlite.err);
  CHECK(sqlite.code == 0);
}

TEST_CASE("a journal locked by another process gives a clear error and loses nothing") {
  cairn::testing::temp_dir dir;
  REQUIRE(run_cli(dir, run_steps("before", 2)).code == 0);
  {
    SQLite::Database holder((dir / ".cairn" / "cairn.db").string(), SQLite::OPEN_READWRITE);
    holder.exec("BEGIN EXCLUSIVE");
    auto r = run_cli(dir, run_steps("blocked", 2));
    CHECK(r.code == 3);
    CHECK_THAT(r.err, Catch::Contains("locked"));
    holder.exec("ROLLBACK");
  }
  auto show = run_cli(dir, {"show", "before", "--json"});
  REQUIRE(show.code == 0);
  CHECK(json::parse(show.out)["steps"].size() == 2);
  CHECK(run_cli(dir, run_steps("after", 2)).code == 0);
}

TEST_CASE("another user's journal is refused with a clear error naming its owner") {
  if (!cairn::testing::require_capability("root", ::geteuid() == 0, "only root can act as two users"))
    return;
  cairn::testing::temp_dir dir;
  REQUIRE(run_cli(dir, run_steps("kept", 2)).code == 0);
  // Even opened up to others, the root-owned CAIRN_HOME is not another user's to use.
  // (0755, not 0777: as root, a home below a folder anyone may write is refused too.)
  ::chmod(dir.path().c_str(), 0755);
  std::filesystem::permissions(dir / ".cairn", std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                                   std::filesystem::perms::group_exec |
                                                   std::filesystem::perms::others_read |
                                                   std::filesystem::perms::others_exec);
  std::filesystem::copy_file(STEP_AGENT, dir / "step_agent");
  for (const auto& args : {run_steps("denied", 2, (dir / "step_agent").string()), std::vector<std::string>{"ls"}}) {
    auto r = run_cli(dir, args, nullptr, 65534);
    INFO(r.out << r.err);
    CHECK(r.code == 3);
    CHECK_THAT(r.err, Catch::Contains("belongs to uid 0") && Catch::Contains((dir / ".cairn").string()));
  }
  CHECK_THAT(run_cli(dir, {"ls"}).out, Catch::Contains("kept") && !Catch::Contains("denied"));
}

namespace {

// `cairn doctor --json`'s check of this name.
json doctor_check(const cairn::testing::temp_dir& dir, const std::string& name) {
  auto r = run_cli(dir, {"doctor", "--json"});
  INFO(r.out << r.err);
  for (const auto& c : json::parse(r.out))
    if (c["check"] == name) return c;
  FAIL("doctor has no check '" << name << "'");
  return {};
}

}  // namespace

// A PostgreSQL "server" on a loopback port that refuses every connection
// with an error message of its choosing, as a hostile server, or anyone
// between cairn and its server without TLS, may: it declines encryption and
// answers the startup packet with ErrorResponse (FATAL, `message`).
class refusing_pg_server {
 public:
  explicit refusing_pg_server(std::string message) : message_(std::move(message)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_, 8) == 0);
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~refusing_pg_server() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  std::string url() const { return "postgresql://cairn@127.0.0.1:" + std::to_string(port_) + "/cairn"; }

 private:
  static bool read_full(int fd, void* to, std::size_t n) {
    for (std::size_t got = 0; got < n;) {
      const ssize_t r = ::read(fd, static_cast<char*>(to) + got, n - got);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }
  void serve() {
    for (;;) {
      const int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;  // shut down
      for (;;) {
        std::uint32_t length = 0, code = 0;
        if (!read_full(c, &length, 4) || !read_full(c, &code, 4)) break;
        length = ntohl(length);
        code = ntohl(code);
        if (length < 8 || length > 10000) break;
        std::string rest(length - 8, '\0');
        if (!read_full(c, rest.data(), rest.size())) break;
        if (code == 80877103 || code == 80877104) {  // SSLRequest, GSSENCRequest: declined
          if (::write(c, "N", 1) != 1) break;
          continue;
        }
        std::string fields = std::string("SFATAL") + '\0' + "C28000" + '\0' + "M" + message_ + '\0' + '\0';
        std::string reply = "E";
        const std::uint32_t n = htonl(static_cast<std::uint32_t>(fields.size() + 4));
        reply.append(reinterpret_cast<const char*>(&n), 4);
        reply += fields;
        [[maybe_unused]] const auto sent = ::write(c, reply.data(), reply.size());
        break;  // the connection ends with the refusal
      }
      ::close(c);
    }
  }
  std::string message_;
  int listener_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST_CASE("a journal server's error text reaches the terminal escaped, from doctor and every command") {
  cairn::testing::temp_dir dir;
  // Sets the terminal's title, then hides the rest of the line.
  refusing_pg_server server("no such role\x1b]0;pwned\x07\n\x1b[8mhidden\r");
  const auto raw_control = [](const std::string& text) {
    for (char c : text)
      if (c == '\x1b' || c == '\x07' || c == '\r') return true;
    return false;
  };

  auto doctor = run_cli(dir, {"doctor", "--db", server.url()});
  INFO(doctor.out << doctor.err);
  CHECK(doctor.code == 3);
  CHECK_FALSE(raw_control(doctor.out + doctor.err));
  // The refusal is quoted, on the journal's one line.
  std::string journal_line;
  std::istringstream lines(doctor.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("FAIL journal ", 0) == 0) journal_line = line;
  // Its line break is a space (libpq's own messages go on over lines); the rest is escaped.
  CHECK_THAT(journal_line, Catch::Contains("no such role\\x1b]0;pwned\\x07 \\x1b[8mhidden\\r"));
  CHECK_THAT(doctor.out, Catch::EndsWith("not ready yet: journal failed (see each fix above)\n"));

  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"ls"}, {"show", "r1"}, {"workers"}, {"signal", "r1", "go"}, {"cancel", "r1"}}) {
    auto args = command;
    args.insert(args.end(), {"--db", server.url()});
    auto r = run_cli(dir, args);
    INFO(command[0] << ": " << r.out << r.err);
    CHECK(r.code != 0);
    CHECK_THAT(r.err, Catch::Contains("no such role"));
    CHECK_FALSE(raw_control(r.out + r.err));
  }
}

TEST_CASE("a PostgreSQL journal out of reach is said on one line, without literal escapes") {
  cairn::testing::temp_dir dir;
  // No server listens on this socket: libpq's message goes on over a second, tab-indented line.
  const std::string url = "postgresql://cairn@/cairn?host=" + (dir / "no-server").string();
  auto r = run_cli(dir, {"ls", "--db", url});
  INFO(r.out << r.err);
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("No such file or directory Is the server running locally"));
  CHECK_THAT(r.err, !Catch::Contains("\\n") && !Catch::Contains("\\t"));
}

TEST_CASE("doctor says what the journal and the home take on disk, a sparse image's apparent size apart") {
  cairn::testing::temp_dir dir;
  // A file of 4 MiB in the run's logs: what doctor counts must hold it.
  REQUIRE(run_cli(dir, {"run", STEP_AGENT, "--id", "s1", "--sandbox", "none", "--input", R"({"steps":2})"}).code == 0);
  {
    std::ofstream big(dir / ".cairn" / "logs" / "big.log", std::ios::binary);
    const std::string mib(1 << 20, 'x');
    for (int i = 0; i < 4; ++i) big << mib;
  }
  auto space = doctor_check(dir, "space");
  const auto detail = space["detail"].get<std::string>();
  INFO(detail);
  CHECK(space["ok"] == true);
  CHECK_THAT(detail, Catch::StartsWith((dir / ".cairn").string() + " "));
  CHECK_THAT(detail, Catch::Contains("journal ") && Catch::Contains("workspaces ") && Catch::Contains("logs 4."));
  // The total, first: at least the 4 MiB log and the journal file.
  const auto total = std::stod(detail.substr((dir / ".cairn").string().size() + 1));
  CHECK(total >= 4.0 + static_cast<double>(std::filesystem::file_size(dir / ".cairn" / "cairn.db")) / (1 << 20));
}

TEST_CASE("doctor names the journal's backend and schema, times one read and one commit, and leaves no trace") {
  cairn::testing::temp_dir dir;
  REQUIRE(run_cli(dir, {"submit", STEP_AGENT, "--id", "d1", "--sandbox", "none"}).code == 0);
  const auto db = (dir / ".cairn" / "cairn.db").string();

  auto reached = doctor_check(dir, "journal");
  CHECK(reached["ok"] == true);
  CHECK_THAT(reached["detail"].get<std::string>(), Catch::Contains(db) && Catch::Contains("sqlite, SQLite 3."));
  auto schema = doctor_check(dir, "journal schema");
  CHECK(schema["ok"] == true);
  CHECK_THAT(schema["detail"].get<std::string>(), Catch::Contains("this cairn's"));
  auto latency = doctor_check(dir, "journal latency");
  CHECK(latency["ok"] == true);
  CHECK_THAT(latency["detail"].get<std::string>(),
             Catch::Matches("one read [0-9.]+ ms, one committed write [0-9.]+ ms"));
  {
    SQLite::Database raw(db, SQLite::OPEN_READONLY);
    CHECK(raw.execAndGet("SELECT count(*) FROM workers").getInt() == 0);  // the probe row is gone
  }

  // Schema 5 (before workers): reported, not migrated: the next writer does that.
  {
    SQLite::Database raw(db, SQLite::OPEN_READWRITE);
    raw.exec("DROP TABLE workers; DROP INDEX runs_by_owner; ALTER TABLE runs DROP COLUMN workspace_host; "
             "PRAGMA user_version = 5");
  }
  schema = doctor_check(dir, "journal schema");
  CHECK(schema["ok"] == true);
  CHECK_THAT(schema["detail"].get<std::string>(), Catch::Contains("will be migrated by the next writer"));
  {
    SQLite::Database raw(db, SQLite::OPEN_READONLY);
    CHECK(raw.execAndGet("PRAGMA user_version").getInt() == 5);
  }

  // From a newer cairn: a failure, with the fix.
  { SQLite::Database(db, SQLite::OPEN_READWRITE).exec("PRAGMA user_version = 99"); }
  schema = doctor_check(dir, "journal schema");
  CHECK(schema["ok"] == false);
  CHECK_THAT(schema["detail"].get<std::string>(), Catch::Contains("schema version 99"));
  CHECK_THAT(schema["fix"].get<std::string>(), Catch::Contains("upgrade cairn"));
}

TEST_CASE("cairn --version says its version, protocol and journal schemas, as text and as JSON") {
  cairn::testing::temp_dir dir;
  for (const char* flag : {"--version", "-V"}) {
    auto text = run_cli(dir, {flag});
    CHECK(text.code == 0);
    CHECK_THAT(text.out, Catch::Matches(R"(cairn \d+\.\d+\.\d+\nprotocol v\d+, journal schema v\d+ \(SQLite\), v\d+ \(PostgreSQL\)\n)"));
    auto as_json = run_cli(dir, {flag, "--json"});
    CHECK(as_json.code == 0);
    const auto v = json::parse(as_json.out);
    CHECK_THAT(text.out, Catch::StartsWith("cairn " + v["cairn"].get<std::string>() + "\n"));
    CHECK(v["protocol"] == 2);
    CHECK(v["journal_schema"]["sqlite"].is_number_integer());
    CHECK(v["journal_schema"]["postgresql"].is_number_integer());
  }
  CHECK_THAT(run_cli(dir, {"--help"}).out, Catch::Contains("-V,--version"));
  auto none = run_cli(dir, {});
  CHECK(none.code == 2);
  CHECK_THAT(none.err, Catch::Contains("A subcommand is required"));
}

TEST_CASE("resuming a run whose files are on another machine ends at once with why, and changes nothing") {
  cairn::testing::temp_dir dir;
  REQUIRE(run_cli(dir, run_steps("moved", 3)).code == 0);
  // As a journal copied without its workspaces: the run was left mid-way by
  // a process of this host that is gone, and its folder is not here.
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  {
    SQLite::Database db((dir / ".cairn" / "cairn.db").string(), SQLite::OPEN_READWRITE);
    SQLite::Statement update(db, "UPDATE runs SET status = 'running', output = NULL, finished_at_ms = NULL, owner = ?, "
                                 "workspace = '/nonexistent/cairn-test/moved' WHERE id = 'moved'");
    update.bind(1, std::string(host) + ":4194303");  // no such process
    REQUIRE(update.exec() == 1);
  }
  const auto events_before = json::parse(run_cli(dir, {"show", "moved", "--json"}).out)["events"].size();
  auto r = run_cli(dir, {"resume", "moved"});
  CHECK(r.code == 4);
  CHECK_THAT(r.err, Catch::Contains("/nonexistent/cairn-test/moved does not exist on this machine"));
  CHECK_THAT(r.err, Catch::Contains("mount it, or resume the run where it is"));
  // Said once, as the command's error: not a warning repeated until someone stops it.
  CHECK(r.err.find("warning:") == std::string::npos);
  auto show = json::parse(run_cli(dir, {"show", "moved", "--json"}).out);
  CHECK(show["steps"].size() == 3);
  CHECK(show["run"]["status"] == "running");
  // The refusal is journaled once, for `cairn show`.
  CHECK(show["events"].size() == events_before + 1);
}

TEST_CASE("a command cairn does not have is named, with the commands it has") {
  cairn::testing::temp_dir dir;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"attach", "run-1"}, {"prune", "x"}, {"--db", "other.db", "lgs"}}) {
    auto r = run_cli(dir, args);
    const auto& name = args[0] == "--db" ? args[2] : args[0];
    INFO(name);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("cairn: no command '" + name + "'; the commands are run, submit, serve"));
    CHECK_THAT(r.err, Catch::Contains("Run 'cairn --help' for what it takes."));
  }
  CHECK_THAT(run_cli(dir, {"version"}).err, Catch::Contains("the version is `cairn --version`"));
  // A name an agent could have planted reaches the terminal escaped.
  CHECK_THAT(run_cli(dir, {"\x1b[2Jwipe"}).err, !Catch::Contains("\x1b"));
  // Nothing was created on the way.
  CHECK_FALSE(std::filesystem::exists(dir / ".cairn"));
  CHECK_FALSE(std::filesystem::exists(dir / "other.db"));
}

TEST_CASE("an agent that cannot start is refused before a run is made: a script without #!, a file not executable") {
  cairn::testing::temp_dir dir;
  const auto script = dir / "agent.py";
  {
    std::ofstream(script) << "import cairn\nprint('hello')\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto r = run_cli(dir, {"run", script.string()});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("neither a compiled program nor a script that names its interpreter"));
  CHECK_THAT(r.err, Catch::Contains("#!/usr/bin/env python3"));
  std::filesystem::permissions(script, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  r = run_cli(dir, {"submit", script.string()});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("is not executable: chmod +x it"));
  CHECK_FALSE(std::filesystem::exists(dir / ".cairn" / "cairn.db"));
}

TEST_CASE("an agent whose program cannot be executed in the sandbox fails at once; a crash is retried, its output shown once") {
  cairn::testing::temp_dir dir;
  const auto write_script = [&](const std::string& name, const std::string& text) {
    const auto path = dir / name;
    std::ofstream(path) << text;
    using std::filesystem::perms;
    std::filesystem::permissions(path, perms::owner_all | perms::group_read | perms::group_exec | perms::others_read |
                                           perms::others_exec);  // the sandbox uid reads and runs it
    return path.string();
  };
  // What its script starts is not in the sandbox: the shell says 127, every attempt would.
  auto missing = run_cli(dir, {"run", write_script("missing", "#!/bin/sh\nnosuchcommand --go\n"), "--id", "m"});
  INFO(missing.out << missing.err);
  CHECK(missing.code == 1);
  CHECK_THAT(missing.err, Catch::Contains("run m failed: the agent could not be started: it exited with code 127"));
  CHECK_THAT(missing.err, Catch::Contains("nosuchcommand: not found"));
  CHECK_THAT(missing.out + missing.err, !Catch::Contains("attempt 2"));

  // An agent that crashes is tried again; each attempt's message shows its own output, on one line.
  auto crash = run_cli(dir, {"run", write_script("crash", "#!/bin/sh\necho starting\necho oops >&2\nexit 3\n"), "--id",
                             "c", "--max-attempts", "2"});
  INFO(crash.out << crash.err);
  CHECK(crash.code == 1);
  CHECK_THAT(crash.out + crash.err, Catch::Contains("attempt 2"));
  CHECK_THAT(crash.err, Catch::Contains("gave up after 2 crashed attempts; last: the agent closed its channel without "
                                        "finishing (exited with code 3); its last output: starting | oops\n"));
  CHECK_THAT(crash.err, !Catch::Contains("\\n"));
}

TEST_CASE("cairn ls filters by status, agent and age, pages with --limit and --before, and --json stays lean") {
  cairn::testing::temp_dir dir;
  for (const char* id : {"p1", "p2", "p3"}) REQUIRE(run_cli(dir, run_steps(id, 1)).code == 0);
  const auto listed = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "ls");
    args.push_back("--json");
    auto r = run_cli(dir, args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    std::vector<std::string> ids;
    for (const auto& run : json::parse(r.out)) ids.push_back(run["id"]);
    return ids;
  };
  using v = std::vector<std::string>;
  CHECK(listed({}) == v{"p3", "p2", "p1"});
  CHECK(listed({"--status", "completed"}) == v{"p3", "p2", "p1"});
  CHECK(listed({"--status", "failed"}).empty());
  CHECK(listed({"--agent", "step_agent"}) == v{"p3", "p2", "p1"});
  CHECK(listed({"--agent", "other_agent"}).empty());
  CHECK(listed({"--since", "1h"}) == v{"p3", "p2", "p1"});
  CHECK(listed({"--since", "2999-01-01"}).empty());
  CHECK(listed({"--limit", "2"}) == v{"p3", "p2"});
  CHECK(listed({"--limit", "2", "--before", "p2"}) == v{"p1"});

  auto page = run_cli(dir, {"ls", "--limit", "2"});
  CHECK_THAT(page.out, Catch::Contains("the next: cairn ls --before p2 --limit 2"));
  // A listing's row leaves what `cairn show` has: the input, the output, the policy.
  auto row = json::parse(run_cli(dir, {"ls", "--json"}).out)[0];
  CHECK(row["status"] == "completed");
  CHECK_FALSE(row.contains("policy"));
  CHECK_FALSE(row.contains("input"));
  CHECK_FALSE(row.contains("output"));

  auto bad = run_cli(dir, {"ls", "--since", "last week"});
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("is no time"));
  bad = run_cli(dir, {"ls", "--before", "nobody"});
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("no run 'nobody'"));
}

TEST_CASE("resume --agent refuses an ended run, an unknown one and --all; show names the version a run ran") {
  cairn::testing::temp_dir dir;
  REQUIRE(run_cli(dir, run_steps("done", 1)).code == 0);
  auto ended = run_cli(dir, {"resume", "done", "--agent", STEP_AGENT});
  CHECK(ended.code == 2);
  CHECK_THAT(ended.err, Catch::Contains("run done has ended (completed)"));
  CHECK(run_cli(dir, {"resume", "--all", "--agent", STEP_AGENT}).code == 2);
  CHECK(run_cli(dir, {"resume", "ghost", "--agent", STEP_AGENT}).code == 2);
  auto shown = run_cli(dir, {"show", "done"});
  CHECK_THAT(shown.out, Catch::Contains("  version    sha256:"));
  CHECK(std::filesystem::is_directory(dir / ".cairn" / "agents"));
}
