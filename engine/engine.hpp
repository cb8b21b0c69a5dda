// Runs: start, execute in a sandbox, checkpoint every step, retry a crashed
// sandbox from the journal, resume what a dead host process left behind.
// The engine is the one place that writes the journal; runtime only reports.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/policy.hpp"
#include "engine/tools/llm_chat.hpp"
#include "runtime/sandbox.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

enum class errc {
  not_found,  // no such run
  busy,       // a live process executes the run
  bad_request,
};

class engine_error : public std::runtime_error {
 public:
  engine_error(errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  errc code() const { return code_; }

 private:
  errc code_;
};

// Creates the sandbox backend a run asked for ("bwrap" or "none").
using backend_factory = std::function<std::unique_ptr<runtime::sandbox_backend>(const std::string& name)>;
backend_factory default_backends();

struct engine_options {
  std::filesystem::path log_dir;             // agent output: LOG_DIR/RUN_ID.log
  std::chrono::milliseconds hello_timeout{10'000};
  std::chrono::milliseconds retry_backoff{200};  // after the n-th crash: backoff * 2^(n-1)
  std::chrono::milliseconds max_backoff{10'000};
  std::chrono::milliseconds exit_grace{2'000};   // after done/fail, for the agent to exit
  std::optional<llm_endpoint> llm;  // where llm.chat calls go; see llm_endpoint_from_host
  backend_factory backends = default_backends();
};

// What the engine tells whoever watches a run. Called on the executing thread.
class run_observer {
 public:
  virtual ~run_observer() = default;
  virtual void on_attempt(const storage::run_record&, int /*attempt*/) {}
  virtual void on_step(const storage::step_record&) {}
  virtual void on_retry(const protocol::retry_msg&) {}
  virtual void on_emit(const json&) {}
  virtual void on_attempt_failed(int /*attempt*/, const std::string& /*reason*/, bool /*will_retry*/) {}
  virtual void on_warning(const std::string&) {}
};

struct run_request {
  std::string id;  // empty: a new id is generated
  std::filesystem::path agent;
  json input = json::object();
  std::filesystem::path workspace;  // empty: WORKSPACE_ROOT/RUN_ID is up to the caller
  std::string sandbox = "bwrap";
  int max_attempts = 3;
  engine::policy policy = default_policy();
};

// What `cairn settle` records for a tool call in doubt.
struct settlement {
  enum class how { result, error, retry };
  how outcome = how::retry;
  json result;        // for how::result: what the call returned
  std::string error;  // for how::error: why it failed
};

class engine {
 public:
  // `journal` must outlive the engine.
  engine(storage::journal& journal, engine_options options);

  // Records a pending run, or returns the existing one with this id.
  std::pair<storage::run_record, bool> submit(const run_request& request);

  // Drives the run to its end (completed or failed) in this process and
  // returns the final record. A run owned by a live process is refused
  // (errc::busy); one owned by a dead process is taken over. A failed run is
  // given a fresh set of attempts. A completed run is returned as it is.
  // A run whose next step is an at-most-once tool call that was started but
  // never recorded stops in_doubt instead (see settle).
  storage::run_record execute(const std::string& run_id, run_observer* observer = nullptr);

  // Records the outcome of the in-doubt call at `seq` (or that it is to be
  // made again) and makes the run pending, ready for execute. Refused
  // (bad_request) unless that call is the one in doubt; busy while a live
  // process executes the run.
  storage::run_record settle(const std::string& run_id, std::uint64_t seq, const settlement& s);

  // Runs left unfinished by host processes that have died, oldest first,
  // plus pending runs nobody has started.
  std::vector<storage::run_record> orphaned_runs();

  storage::journal& journal() { return journal_; }

 private:
  // Backends are made once per engine: making one checks the bwrap version
  // and sweeps orphaned sandboxes.
  runtime::sandbox_backend& backend(const std::string& name);

  storage::journal& journal_;
  engine_options options_;
  std::map<std::string, std::unique_ptr<runtime::sandbox_backend>> backends_;
};

// A fresh run id: "run-" and 12 hex digits.
std::string new_run_id();

}  // namespace cairn::engine
