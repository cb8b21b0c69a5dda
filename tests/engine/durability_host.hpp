// Shared by the durability proofs (power_loss_test.cpp, ack_order_test.cpp):
// a host process to kill, runs of DURABILITY_AGENT (tests/agents/
// durability_agent.cpp) for it, and the check that what the agents were told
// is in the journal.
//
// The host is a fork of the test binary that runs a scheduler over the
// journal, as `cairn serve` does, with the plain-process backend (no bwrap:
// fast). The test process itself never runs the engine, so the crash points
// (armed from the environment at their first use) arm only in the host.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sqlite3.h>

#include "engine/engine.hpp"
#include "engine/scheduler.hpp"
#include "protocol/frame.hpp"
#include "storage/journal.hpp"

namespace cairn::testing {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// The runs of DURABILITY_AGENT the host drives: a mailer tool it may call
// (idempotent by default, so a cut during the call replays it instead of
// stopping in doubt), which logs each call to the host's
// $CAIRN_TEST_TOOL_LOG when it is set (tests/agents/record_tool.sh).
inline engine::run_request durability_run(const fs::path& home, const std::string& id, json input,
                                          const std::string& idempotency = "idempotent") {
  engine::run_request r;
  r.id = id;
  r.agent = DURABILITY_AGENT;
  r.input = std::move(input);
  r.workspace = home / "workspaces" / id;
  r.sandbox = "none";
  r.policy = engine::parse_policy({{"tools",
                                    {{"mailer",
                                      {{"command", {RECORD_TOOL}},
                                       {"input", {{"to", "string"}}},
                                       {"idempotency", idempotency},
                                       {"env", {"CAIRN_TEST_TOOL_LOG"}},
                                       {"timeout_ms", 20000}}}}}});
  return r;
}

inline engine::engine_options host_engine_options(const fs::path& home) {
  engine::engine_options o;
  o.home = home;
  o.retry_backoff = 10ms;
  o.suspend_after = 100ms;  // a sleep of more suspends the run: resumed by replay
  o.hello_timeout = 30s;
  return o;
}

// Appends one line to `file` in one write(2). A SIGKILL can still cut that
// write short where it crosses a page of the file (seen once in 200 power
// cuts): such a line, left without its end, was never told whole. It is
// ended here before the next line, so that it stays a line of its own, which
// readers skip as a report the kill cut short (report_lines).
inline void append_line(const fs::path& file, const std::string& line) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  struct stat st {};
  char last = '\n';
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) != 1) last = '\n';
  std::string text = (last == '\n' ? "" : "\n") + line + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
}

// The lines append_line wrote whole, as JSON; one a kill cut short is left out.
inline std::vector<json> report_lines(const fs::path& file) {
  std::vector<json> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (auto j = json::parse(line, nullptr, false); !j.is_discarded()) lines.push_back(std::move(j));
  return lines;
}

// Forks the host: `arm` runs first in it (a crash point, a VFS: before the
// journal is opened), then `prepare` (submits runs), then a scheduler runs
// until every run in `ids` has ended (finished, or stopped in doubt). Each
// run that ends is reported (one JSON line in HOME/reported) after the
// engine returned it, as a caller would be told. Exits 0, or 1
// with the error on stderr (HOME/host.log).
inline pid_t start_host(const fs::path& home, const std::vector<std::string>& ids, const std::function<void()>& arm,
                        const std::function<void(engine::engine&)>& prepare) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int log = ::open((home / "host.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ::dup2(log, 2);
  try {
    arm();
    auto options = host_engine_options(home);
    {
      auto journal = storage::open_journal(home / "cairn.db");
      engine::engine eng(*journal, options);
      prepare(eng);
    }
    engine::scheduler_options s;
    s.db = home / "cairn.db";
    s.engine = options;
    s.max_concurrent = 8;
    s.on_return = [&](const storage::run_record& run) {
      if (run.status == storage::run_status::completed)
        append_line(home / "reported", json{{"run", run.id}, {"output", run.output}}.dump());
    };
    s.on_error = [](const std::string& id, const std::string& error) {
      std::fprintf(stderr, "host: run %s: %s\n", id.c_str(), error.c_str());
    };
    engine::scheduler scheduler(s);
    engine::stop_flag stop;
    scheduler.run(
        [&](storage::journal& j) {
          for (const auto& id : ids) {
            auto run = j.find_run(id);
            if (!run || !(run->finished_at_ms || run->status == storage::run_status::in_doubt)) return false;
          }
          return true;
        },
        stop);
    ::_exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host: %s\n", e.what());
    ::_exit(1);
  }
}

inline int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// As wait_status, for a host that must end within `deadline`: one still
// running then is killed, and nullopt says so.
inline std::optional<int> wait_status_within(pid_t pid, std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return status;
    if (std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(5ms);
  }
  ::kill(pid, SIGKILL);
  wait_status(pid);
  return std::nullopt;
}

// One thing the host told an agent, which must be in the journal.
struct told {
  std::string run_id;
  protocol::step_result result;
  std::string log;  // the observer's log it was read from
};

// Reads the observers' logs (see durability_agent.cpp) under HOME/ws: every
// acknowledgement (paired, in order, with the step or retry message it
// answers) and every result the host sent. Each log is read once, after its
// observer closed it.
class observed_channels {
 public:
  explicit observed_channels(fs::path home) : home_(std::move(home)) {}

  // Waits (bounded) for every observer to finish, then returns what the logs
  // read for the first time hold.
  std::vector<told> collect() {
    std::vector<told> found;
    std::error_code ec;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (const auto& ws : fs::directory_iterator(home_ / "workspaces", ec)) {
      for (const auto& entry : fs::directory_iterator(ws.path(), ec)) {
        const auto name = entry.path().filename().string();
        if (!name.starts_with("observed.") || !name.ends_with(".in")) continue;
        if (!read_.insert(entry.path()).second) continue;
        auto base = entry.path().string();
        base.resize(base.size() - 3);
        while (!fs::exists(base + ".closed")) {
          if (std::chrono::steady_clock::now() > deadline)
            throw std::runtime_error("the observer of " + base + " did not finish within 60 s");
          std::this_thread::sleep_for(2ms);
        }
        read_log(base, found);
      }
    }
    return found;
  }

 private:
  static std::vector<json> frames(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::string bytes{std::istreambuf_iterator<char>(in), {}};
    protocol::frame_decoder decoder;
    decoder.feed(bytes);
    std::vector<json> out;
    while (auto j = decoder.next()) out.push_back(std::move(*j));
    return out;
  }

  static void read_log(const std::string& base, std::vector<told>& found) {
    // The step attempts the agent sent, in order: each is answered by an ack
    // (journaled) or a retry (not journaled).
    std::vector<protocol::step_result> asked;
    for (const auto& j : frames(base + ".out")) {
      auto m = protocol::parse_agent_message(j);
      if (auto* s = std::get_if<protocol::step_msg>(&m)) asked.push_back(s->result);
    }
    std::string run_id;
    std::size_t answers = 0;
    auto answer = [&](std::uint64_t seq, bool acked) {
      if (answers >= asked.size() || asked[answers].seq != seq)
        throw std::runtime_error(base + ": an answer for seq " + std::to_string(seq) +
                                 " answers no step the agent sent");
      if (acked) found.push_back({run_id, asked[answers], base});
      ++answers;
    };
    for (const auto& j : frames(base + ".in")) {
      auto m = protocol::parse_host_message(j);
      if (auto* s = std::get_if<protocol::start_msg>(&m)) run_id = s->run_id;
      if (auto* r = std::get_if<protocol::result_msg>(&m)) found.push_back({run_id, r->result, base});
      if (auto* a = std::get_if<protocol::ack_msg>(&m)) answer(a->seq, true);
      if (auto* r = std::get_if<protocol::retry_msg>(&m)) answer(r->seq, false);
    }
  }

  fs::path home_;
  std::set<fs::path> read_;
};

// PRAGMA integrity_check of the journal, "ok" when it is sound.
inline std::string integrity(const fs::path& db) {
  sqlite3* handle = nullptr;
  std::string verdict = "cannot open";
  if (sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    verdict = sqlite3_errmsg(handle);
    if (sqlite3_prepare_v2(handle, "PRAGMA integrity_check", -1, &stmt, nullptr) == SQLITE_OK) {
      verdict.clear();
      while (sqlite3_step(stmt) == SQLITE_ROW)
        verdict += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(handle);
  return verdict;
}

// Which of `told` the journal lacks or holds differently, one line each ("" when none).
inline std::string missing_from_journal(const fs::path& db, const std::vector<told>& told_agents) {
  auto journal = storage::open_journal(db);
  std::map<std::string, std::vector<storage::step_record>> steps;
  std::ostringstream missing;
  for (const auto& t : told_agents) {
    auto [it, fresh] = steps.try_emplace(t.run_id);
    if (fresh) it->second = journal->steps(t.run_id);
    const auto& rows = it->second;
    const auto* row = t.result.seq < rows.size() ? &rows[t.result.seq].result : nullptr;
    if (!row || row->seq != t.result.seq || row->name != t.result.name || row->kind != t.result.kind ||
        row->ok != t.result.ok || row->output != t.result.output || row->error.message != t.result.error.message)
      missing << "run " << t.run_id << " step " << t.result.seq << " ('" << t.result.name << "', "
              << protocol::to_string(t.result.kind) << ") was acknowledged to the agent (" << t.log << ".in) but "
              << (row ? "the journal holds " + protocol::to_json(*row).dump() : std::string("is not in the journal"))
              << "\n";
  }
  return missing.str();
}

}  // namespace cairn::testing
