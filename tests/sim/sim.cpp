#include "tests/sim/sim.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <system_error>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "engine/attempt.hpp"
#include "engine/fake_clock.hpp"
#include "engine/engine.hpp"
#include "engine/io.hpp"
#include "engine/tools/tool.hpp"
#include "engine/ledger.hpp"
#include "engine/liveness.hpp"
#include "engine/scheduler.hpp"
#include "engine/run_fork.hpp"
#include "engine/run_journal.hpp"
#include "engine/workspace_checkpoints.hpp"
#include "storage/memory/memory_journal.hpp"
#include "tests/sim/sim_agent.hpp"
#include "tests/sim/sim_workspace.hpp"

namespace cairn::sim {
namespace {

using json = nlohmann::json;
namespace effects = engine::effects;

constexpr std::int64_t lease_ms = 15'000;
constexpr std::int64_t epoch_ms = 1'800'000'000'000;  // the virtual clock starts here (2027)
constexpr std::size_t max_drivers = 3;               // runs one worker drives at once

// The virtual clock: storage::now_ms() and the journal read it while a
// simulation runs (one at a time per process).
std::int64_t virtual_now = epoch_ms;
std::int64_t read_virtual_now() { return virtual_now; }

// A run's progress through one attempt: one effect per advance.
struct driver {
  std::string run;
  engine::journal_limits limits;
  std::unique_ptr<engine::run_journal> port;  // the attempt's journal port, as the real driver has it
  std::uint64_t seq = 0;
  int phase = 0;
  json tool_output;
  int attempt = 0;
  std::unique_ptr<engine::workspace_keeper> keeper;  // the attempt's checkpoints, as the driver holds them
  fake_keeper* fake = nullptr;                      // the same
  bool wrote = false;                               // the agent wrote its files for the step at seq
};

// What wakes an attempt of the real driver: its run's wake-ups in this
// process (wake_run, which every ledger here calls after its commits). The
// engine's attempt_events also listens for other processes' (a thread, and
// a folder beside the journal); here every worker is in this process.
// While faults last, `lost` may swallow one (a hint dropped on its way):
// the attempt must still move, by its own deadlines and the scheduler's
// level-triggered look.
class sim_wakeups final : public engine::attempt_wakeups {
 public:
  sim_wakeups(const std::string& run, std::function<bool()> lost) : lost_(std::move(lost)), registration_(run, wake_) {}
  void watch_process(pid_t) override {}  // the agent's end closes its channel
  int fd() const override { return wake_.fd(); }
  bool take() const override { return wake_.take() && !lost_(); }

 private:
  std::function<bool()> lost_;
  engine::wake_event wake_;
  engine::wake_registration registration_;
};

// A run a worker executes with the real driver: its attempts, one after
// another, as the engine's execute_run makes them, on an event loop of its
// own that the simulator polls when the worker acts. Destroyed, it drops
// the coroutines and kills the agent (a crash, a lost lease).
struct attempt_slot {
  std::string run;
  storage::run_record record;
  engine::policy policy;
  engine::attempt_options options;
  engine::run_observer observer;
  std::unique_ptr<engine::run_journal> journal;
  std::unique_ptr<engine::attempt_journal> port;  // journal, with the simulator's checks
  std::unique_ptr<sim_wakeups> wakeups;
  int attempt = 0;
  bool over = false;  // its coroutine returned
  std::unique_ptr<boost::asio::io_context> io = std::make_unique<boost::asio::io_context>();
  std::optional<engine::timer> nudge;
  bool nudging = false;  // nudge is set
  boost::asio::steady_timer* commit_gate = nullptr;  // an effect waits for the worker's next event
  fake_keeper* keeper = nullptr;  // the attempt's checkpoints (its driver holds them)
  ~attempt_slot() {
    // The coroutines first: they hold the rest.
    nudge.reset();
    io.reset();
  }
};

// A worker process: its journal objects (the ledger's and its reads), its
// lease, the runs it drives. A crash drops it; a paused one does nothing
// until its time comes.
struct worker {
  int slot = 0;
  std::string tag;    // w<slot>.<n>, for the trace
  std::string owner;  // its owner id (engine/owner.hpp's form, of another host)
  std::unique_ptr<engine::ledger> writes;
  std::unique_ptr<storage::journal> reads;
  bool registered = false;  // its worker row is in the journal: it may take runs
  std::int64_t renew_at = 0;
  std::int64_t paused_until = 0;
  std::map<std::string, std::unique_ptr<driver>> drivers;
  // --driver real: its sandboxes, and the runs it executes.
  std::unique_ptr<sim_backend> backend;
  std::map<std::string, std::unique_ptr<attempt_slot>> attempts;
};

// Where the journal lives: what opens a connection to it, and the faults
// the backend can play.
class database {
 public:
  virtual ~database() = default;
  virtual std::unique_ptr<storage::journal> open() = 0;
  virtual bool faults() const { return false; }  // power cuts and failing writes
  virtual void lose_power() {}
  virtual void inject_faults(std::function<void(storage::memory::fault_point)>) {}
};

class memory_database : public database {
 public:
  explicit memory_database(bool no_sync) { db_.never_sync(no_sync); }
  std::unique_ptr<storage::journal> open() override { return db_.open(); }
  bool faults() const override { return true; }
  void lose_power() override { db_.lose_power(); }
  void inject_faults(std::function<void(storage::memory::fault_point)> hook) override {
    db_.inject_faults(std::move(hook));
  }

 private:
  storage::memory::database db_{"memory:sim", read_virtual_now};
};

class sqlite_database : public database {
 public:
  sqlite_database() {
    // In memory when the machine has a tmpfs: a simulated journal's fsyncs need not reach a disk.
    std::error_code ec;
    const auto shm = std::filesystem::path("/dev/shm");
    auto base = (std::filesystem::is_directory(shm, ec) && ::access(shm.c_str(), W_OK) == 0
                     ? shm
                     : std::filesystem::temp_directory_path()) /
                "cairn-sim.XXXXXX";
    std::string name = base.string();
    if (!::mkdtemp(name.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + name);
    dir_ = name;
  }
  ~sqlite_database() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::unique_ptr<storage::journal> open() override { return storage::open_journal(dir_ / "cairn.db"); }

 private:
  std::filesystem::path dir_;
};

// A violation of what users rely on: ends the simulation.
struct violation {
  std::string what;
};

class world final : public agent_watcher {
 public:
  explicit world(const options& o) : o_(o), rng_(o.seed), real_(o.driver == "real") {
    virtual_now = epoch_ms;
    // The engine's blocking work (a workspace's roll-back, with either driver) on this thread.
    engine::run_blocking_inline(true);
    if (real_) {
      // The engine's clock moves with the simulation's (advance_clock); the
      // journal's wall time is the simulation's.
      clock_.emplace();
      engine::grant_test_tools([this] { return make_tools(); });
    }
    storage::set_now_ms_for_testing(read_virtual_now);
    if (o.backend == "sqlite") db_ = std::make_unique<sqlite_database>();
    else db_ = std::make_unique<memory_database>(o.no_sync);
    reopen_clients();
    make_workload();
  }
  ~world() {
    workers_.clear();
    signaller_.reset();
    observer_.reset();
    db_.reset();
    storage::set_now_ms_for_testing(nullptr);
    engine::run_blocking_inline(false);
    if (real_) {
      engine::grant_test_tools(nullptr);
      clock_.reset();
    }
  }

  outcome run() {
    outcome out;
    try {
      for (int slot = 0; slot < slots_; ++slot) start_worker(slot, std::nullopt);
      for (;; ++events_) {
        const bool quiet = events_ >= static_cast<std::uint64_t>(o_.fault_events);
        if (quiet && !quiet_) begin_quiet();
        if (quiet && all_ended()) break;
        if (quiet && events_ > static_cast<std::uint64_t>(o_.fault_events) + 30'000) liveness_failed();
        step(quiet);
        // What an event that wrote nothing (a clock tick, a pause, a read)
        // cannot have changed is not read again.
        if (std::exchange(written_, false)) check();
      }
      check_checkpoints(true);
      check_ends();
    } catch (const violation& v) {
      out.ok = false;
      out.failure = fmt::format("{} (after {} events, at {} ms)", v.what, events_, virtual_now - epoch_ms);
    }
    out.trace_hash = hash_;
    out.events = events_;
    out.runs = ended_runs();
    return out;
  }

 private:
  // ---- the workload ----

  void make_workload() {
    const int runs = 2 + static_cast<int>(below(4));
    for (int i = 0; i < runs; ++i) {
      const std::string id = fmt::format("r{}", i);
      std::vector<op> script;
      const int ops = 3 + static_cast<int>(below(6));
      for (int k = 0; k < ops; ++k) {
        const auto r = below(100);
        op o;
        o.kind = r < 40 ? op::step : r < 55 ? op::at_most_once : r < 70 ? op::idempotent : r < 85 ? op::sleep : op::signal;
        if (o.kind == op::sleep) o.ms = 100 + static_cast<std::int64_t>(below(20'000));
        script.push_back(o);
      }
      // A child run, started at one step and joined at a later one. Its script has no at-most-once call: one in doubt
      // would stop the child, and its parent with it, until a person settles.
      if (below(3) == 0) {
        const auto at = below(script.size() - 1);
        const auto join = at + 1 + below(script.size() - at - 1);
        script[at] = op{op::child};
        script[join] = op{op::join, 0, at};
        std::vector<op> child;
        for (int k = 1 + static_cast<int>(below(4)); k > 0; --k) {
          const auto r = below(3);
          child.push_back(r == 0 ? op{op::step} : r == 1 ? op{op::idempotent} : op{op::sleep, 100 + static_cast<std::int64_t>(below(5'000))});
        }
        scripts_[child_id(id, at)] = std::move(child);
      }
      scripts_[id] = std::move(script);
      storage::new_run run;
      run.id = id;
      // The driver reads the program's first bytes (is it a script?): with
      // the real one, a program that exists, this one.
      run.agent = real_ ? std::filesystem::read_symlink("/proc/self/exe").string() : "/sim/agent";
      run.sandbox = "none";
      run.workspace = "/sim/" + id;
      run.max_attempts = 1'000;
      signaller_->create_run(run);
      trace(fmt::format("submit {} ({} ops)", id, scripts_[id].size()));
    }
  }

  // ---- the schedule ----

  std::uint64_t below(std::uint64_t n) { return rng_() % n; }

  void step(bool quiet) {
    const auto r = below(1000);
    if (!quiet && r < 15) return crash();
    if (!quiet && r < 30) return pause();
    if (!quiet && r < 38) return zombie();
    if (!quiet && r < 42 && db_->faults()) return lose_power();
    if (!quiet && r < 60 && db_->faults()) return toggle_faults();
    if (r < 90) return restart();
    if (r < 120) return send_signal(false);
    // `cairn cancel`, and an agent's sandbox dying under it (the model's
    // own; the real driver's agents neither die nor hear cancels yet).
    if (!real_ && !quiet && r < 124) return cancel_one();
    if (!real_ && !quiet && r < 134) return agent_dies();
    if (!quiet && r >= 134 && r < 138) return fork_one();
    if (r < 320) return advance_clock();
    if (real_ && r < 520) return agent_moves();
    std::vector<worker*> active;
    for (auto& w : workers_)
      if (w->paused_until <= virtual_now) active.push_back(w.get());
    if (active.empty()) return advance_clock();
    work(*active[below(active.size())]);
  }

  void advance_clock() {
    const std::int64_t by = below(10) < 7 ? 1 + static_cast<std::int64_t>(below(200))
                                          : 1 + static_cast<std::int64_t>(below(2 * lease_ms));
    virtual_now += by;
    if (clock_) clock_->advance(std::chrono::milliseconds(by));
    trace(fmt::format("clock +{} ms", by));
  }

  void begin_quiet() {
    quiet_ = true;
    db_->inject_faults(nullptr);
    trace("quiet: no more faults");
    // A zombie is a fault too: its old self goes. Two live processes under
    // one owner id each take the run back from the other (the epoch fence
    // keeps that safe, nothing makes it end).
    std::set<std::string> owners;
    for (auto it = workers_.rbegin(); it != workers_.rend();) {
      if (owners.insert((*it)->owner).second) {
        ++it;
        continue;
      }
      trace(fmt::format("the old {} of {} ends", (*it)->tag, (*it)->owner));
      it = decltype(it)(workers_.erase(std::next(it).base()));
    }
    send_signal(true);
  }

  // ---- faults ----

  void crash() {
    if (workers_.empty()) return;
    const auto at = below(workers_.size());
    trace(fmt::format("crash {}", workers_[at]->tag));
    workers_.erase(workers_.begin() + static_cast<std::ptrdiff_t>(at));
  }

  void pause() {
    if (workers_.empty()) return;
    auto& w = *workers_[below(workers_.size())];
    const std::int64_t ms = 1 + static_cast<std::int64_t>(below(3 * lease_ms));
    w.paused_until = virtual_now + ms;
    trace(fmt::format("pause {} for {} ms", w.tag, ms));
  }

  // A paused worker's id comes back in a new process while the old one
  // sleeps (a reused owner id): the journal's epoch must refuse whatever the
  // old one writes after the new one takes a run over.
  void zombie() {
    for (auto& w : workers_) {
      if (w->paused_until <= virtual_now) continue;
      const auto same = std::count_if(workers_.begin(), workers_.end(),
                                      [&](const auto& other) { return other->owner == w->owner; });
      if (same > 1) continue;
      const auto owner = w->owner;
      const int slot = w->slot;
      trace(fmt::format("zombie: {} comes back while {} is paused", owner, w->tag));
      start_worker(slot, owner);
      return;
    }
  }

  void lose_power() {
    written_ = true;
    trace("power cut");
    workers_.clear();
    signaller_.reset();
    observer_.reset();
    db_->lose_power();
    reopen_clients();
    check_acknowledged_signals();
    check_checkpoints_kept();
  }

  void toggle_faults() {
    faulty_ = !faulty_;
    trace(faulty_ ? "journal faults on" : "journal faults off");
    if (!faulty_) return db_->inject_faults(nullptr);
    db_->inject_faults([this](storage::memory::fault_point) {
      const auto r = below(100);
      if (r < 85) return;
      static constexpr storage::errc codes[] = {storage::errc::locked, storage::errc::io, storage::errc::disk_full};
      throw storage::storage_error(codes[r % 3], "injected by the simulator");
    });
  }

  void restart() {
    for (int slot = 0; slot < slots_; ++slot) {
      const bool present = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) { return w->slot == slot; });
      if (!present) return start_worker(slot, std::nullopt);
    }
  }

  void start_worker(int slot, std::optional<std::string> owner) {
    auto w = std::make_unique<worker>();
    w->slot = slot;
    w->tag = fmt::format("w{}.{}", slot, ++incarnations_);
    w->owner = owner ? *owner : fmt::format("sim-{}:boot:{}:1", slot, 1000 + incarnations_);
    w->writes = std::make_unique<engine::ledger>(db_->open(), engine::ledger::single_thread);
    w->reads = db_->open();
    if (real_) w->backend = std::make_unique<sim_backend>(w->tag, scripts_, *this);
    trace(fmt::format("start {} as {}", w->tag, w->owner));
    workers_.push_back(std::move(w));
    register_lease(*workers_.back());
  }

  void register_lease(worker& w) {
    written_ = true;
    storage::worker_record r;
    r.id = w.owner;
    r.host = fmt::format("sim-{}", w.slot);
    r.started_at_ms = r.renewed_at_ms = virtual_now;
    r.lease_expires_at_ms = virtual_now + lease_ms;
    try {
      w.writes->register_worker(r);
      w.registered = true;
      w.renew_at = virtual_now + lease_ms / 3;
    } catch (const storage::storage_error& e) {
      trace(fmt::format("{} cannot register: {}", w.tag, e.what()));
    }
  }

  void reopen_clients() {
    signaller_ = std::make_unique<engine::ledger>(db_->open(), engine::ledger::single_thread);
    observer_ = db_->open();
  }

  void send_signal(bool all) {
    written_ = true;
    for (const auto& [run, script] : scripts_) {
      for (std::uint64_t seq = 0; seq < script.size(); ++seq) {
        if (script[seq].kind != op::signal || sent_.count({run, seq})) continue;
        if (!all && below(3) != 0) continue;
        try {
          auto s = signaller_->enqueue_signal(run, signal_name(seq), json{{"for", seq}}, 1'000);
          sent_.insert({run, seq});
          acked_signals_[run].insert(s.id);
          trace(fmt::format("signal {} {} (id {})", run, signal_name(seq), s.id));
        } catch (const storage::storage_error& e) {
          trace(fmt::format("signal {} {} refused: {}", run, signal_name(seq), e.what()));
        }
        if (!all) return;
      }
    }
  }

  // `cairn cancel` of one run: acknowledged (true) when the run had not
  // ended, and then it must end cancelled, whatever happens next.
  void cancel_one() {
    written_ = true;
    auto it = scripts_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(below(scripts_.size())));
    const auto& run = it->first;
    try {
      if (signaller_->request_cancel(run, "cancelled by the simulation")) {
        cancelled_.insert(run);
        trace(fmt::format("cancel {}", run));
      } else {
        trace(fmt::format("cancel {}: it had ended", run));
      }
    } catch (const storage::storage_error& e) {
      trace(fmt::format("cancel {} refused: {}", run, e.what()));
    }
  }

  // The sandbox of one run in flight dies: what engine::execute_run does
  // with a crashed attempt (its call in doubt ends the run, else a new
  // attempt replays the journal).
  void agent_dies() {
    std::vector<std::pair<worker*, driver*>> flying;
    for (auto& w : workers_)
      if (w->paused_until <= virtual_now)
        for (auto& [id, d] : w->drivers) flying.emplace_back(w.get(), d.get());
    if (flying.empty()) return advance_clock();
    auto [w, d] = flying[below(flying.size())];
    trace(fmt::format("the agent of {} on {} dies at step {}", d->run, w->tag, d->seq));
    if (!apply(*w, *d, effects::attempt_crashed{d->attempt, "the sandbox was killed", true})) return;
    if (auto doubt = engine::find_in_doubt(*w->reads, d->run)) {
      trace(fmt::format("{} finds step {} of {} in doubt", w->tag, doubt->seq, d->run));
      return finish(*w, *d, effects::run_ended{storage::run_status::in_doubt, nullptr,
                                               protocol::error_info{doubt->message, "in_doubt"}});
    }
    try {
      d->attempt = w->writes->begin_attempt(d->run);
    } catch (const storage::storage_error& e) {
      return dropped(*w, *d, e);
    }
    confirm_holder(*w, d->run);
    d->seq = d->port->step_count();
    d->phase = 0;
    d->wrote = false;
    trace(fmt::format("{} begins attempt {} of {} at step {}", w->tag, d->attempt, d->run, d->seq));
    d->keeper.reset();
    watch_workspace(*w, *d);
  }

  // ---- a worker's loop ----

  void work(worker& w) {
    if (!w.registered) return register_lease(w);
    if (virtual_now >= w.renew_at) return renew(w);
    if (real_) {
      if (!w.attempts.empty() && (w.attempts.size() >= max_drivers || below(4) != 0)) {
        auto it = w.attempts.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(below(w.attempts.size())));
        return poll(w, *it->second);
      }
      return look(w);
    }
    if (!w.drivers.empty() && (w.drivers.size() >= max_drivers || below(4) != 0)) {
      auto it = w.drivers.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(below(w.drivers.size())));
      return advance(w, *it->second);
    }
    look(w);
  }

  void renew(worker& w) {
    written_ = true;
    bool current = false;
    try {
      current = engine::run_here(w.writes->renew_lease_async(w.owner, virtual_now + lease_ms, 0));
    } catch (const storage::storage_error& e) {
      trace(fmt::format("{} renewal failed: {}", w.tag, e.what()));
      w.renew_at = virtual_now + 100;
      return;
    }
    w.renew_at = virtual_now + lease_ms / 3;
    trace(fmt::format("{} renews: {}", w.tag, current ? "current" : "lost"));
    if (current) return;
    // Lost (worker_lease.hpp): register afresh; every run in flight checks it still holds its run.
    register_lease(w);
    give_up_lost(w, w.attempts);
    give_up_lost(w, w.drivers);
  }

  // The runs in flight (a worker's drivers or attempts) it no longer holds.
  template <class Runs>
  void give_up_lost(worker& w, Runs& runs) {
    for (auto it = runs.begin(); it != runs.end();) {
      try {
        engine::run_here(w.writes->confirm_held_async(it->first));
        ++it;
      } catch (const storage::storage_error& e) {
        trace(fmt::format("{} gives up {}: {}", w.tag, it->first, e.what()));
        it = runs.erase(it);
      }
    }
  }

  // What the scheduler takes: the engine's rule for a scheduling pass
  // (engine::choose_runs), then execute_run's first look
  // (engine::needs_execution). Which of them goes first is the seed's.
  void look(worker& w) {
    const auto busy = real_ ? w.attempts.size() : w.drivers.size();
    const auto pass = engine::choose_runs(*w.reads, w.owner, "", virtual_now, max_drivers - std::min(busy, max_drivers),
                                          [&](const storage::run_brief& b) {
                                            return w.drivers.count(b.id) || w.attempts.count(b.id);
                                          });
    std::vector<storage::run_record> candidates;
    for (const auto& brief : pass.start) {
      auto run = w.reads->find_run(brief.id);
      if (run && engine::needs_execution(*w.reads, *run, false)) candidates.push_back(std::move(*run));
    }
    if (candidates.empty()) return advance_clock();
    take(w, candidates[below(candidates.size())]);
  }

  void take(worker& w, const storage::run_record& run) {
    written_ = true;
    try {
      if (!w.writes->claim_run(run.id, run.owner, w.owner)) {
        trace(fmt::format("{} loses the race for {}", w.tag, run.id));
        return;
      }
    } catch (const storage::storage_error& e) {
      trace(fmt::format("{} cannot claim {}: {}", w.tag, run.id, e.what()));
      return;
    }
    holder_[run.id] = w.tag;
    trace(fmt::format("{} takes {} (was {}, owner '{}')", w.tag, run.id, storage::to_string(run.status), run.owner));
    if (real_) return take_real(w, run.id);
    auto d = std::make_unique<driver>();
    d->run = run.id;
    d->port = std::make_unique<engine::run_journal>(*w.writes, *w.reads, home_, d->run, d->limits);
    d->seq = d->port->step_count();
    auto& held = *d;
    w.drivers[run.id] = std::move(d);
    // engine::end_before_attempt: a cancel ends the run, a call in doubt stops it.
    if (run.cancel_requested_at_ms) {
      finish(w, held, effects::run_ended{storage::run_status::cancelled, nullptr,
                                         protocol::error_info{"cancelled by the simulation", "cancelled"}});
      return;
    }
    if (auto doubt = engine::find_in_doubt(*w.reads, run.id)) {
      trace(fmt::format("{} finds step {} of {} in doubt", w.tag, doubt->seq, run.id));
      finish(w, held, effects::run_ended{storage::run_status::in_doubt, nullptr,
                                         protocol::error_info{doubt->message, "in_doubt"}});
      return;
    }
    try {
      held.attempt = w.writes->begin_attempt(run.id);
      trace(fmt::format("{} begins attempt {} of {} at step {}", w.tag, held.attempt, run.id, held.seq));
      confirm_holder(w, run.id);
    } catch (const storage::storage_error& e) {
      return dropped(w, held, e);
    }
    watch_workspace(w, held);
  }

  // As the driver begins an attempt (attempt_driver::watch_workspace): the
  // workspace's keeper, through the port, and the baseline it hands first.
  void watch_workspace(worker& w, driver& d) {
    d.port->open_workspaces_with(opener(d.fake));
    engine::policy p;
    p.journal = d.limits;
    auto run = w.reads->find_run(d.run);
    auto watch = engine::run_here(d.port->watch_workspace(*run, p));
    check_pending();
    d.keeper = std::move(watch.keeper);
    if (watch.baseline && apply(w, d, effects::workspace_baseline{std::move(*watch.baseline)}))
      baseline_files_[d.run] = d.fake->taken();
  }

  // ---- the real attempt driver (--driver real) ----

  // The attempt's journal port with the simulator's checks: only the worker
  // that took the run last may write to it, and a worker is fenced off only
  // a run it no longer holds.
  class held_port final : public engine::attempt_journal {
   public:
    held_port(world& sim, const worker& w, attempt_slot& slot)
        : sim_(sim), w_(w), slot_(slot), inner_(*slot.journal), run_(slot.run) {}
    engine::task<void> apply(engine::effect e) override {
      // The ledger commits at the worker's next event, as a committer
      // thread would while the agent runs on: what the driver did before the
      // effect is durable (an ack sent early) may reach the agent first.
      boost::asio::steady_timer gate(co_await boost::asio::this_coro::executor,
                                     boost::asio::steady_timer::time_point::max());
      slot_.commit_gate = &gate;
      boost::system::error_code opened;
      co_await gate.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, opened));
      const auto* step = std::get_if<effects::step_committed>(&e);
      const std::optional<std::uint64_t> seq = step ? std::optional(step->record.result.seq) : std::nullopt;
      const bool baseline = std::holds_alternative<effects::workspace_baseline>(e);
      sim_.touched_.insert(run_);
      try {
        co_await inner_.apply(std::move(e));
      } catch (const storage::storage_error& refused) {
        if (refused.code() == storage::errc::fenced && sim_.holds(w_, run_))
          sim_.fail(fmt::format("{} was fenced off {}, which it holds: {}", w_.tag, run_, refused.what()));
        throw;
      }
      if (!sim_.holds(w_, run_)) {
        auto it = sim_.holder_.find(run_);
        sim_.fail(fmt::format("{} wrote to {}, which {} holds now: two workers execute one run", w_.tag, run_,
                              it == sim_.holder_.end() ? "nobody" : it->second));
      }
      sim_.written_ = true;
      if (seq && slot_.keeper) sim_.committed(run_, *seq, slot_.keeper->taken());
      if (baseline && slot_.keeper) sim_.baseline_files_[run_] = slot_.keeper->taken();
    }
    engine::task<engine::workspace_watch> watch_workspace(const storage::run_record& run,
                                                          const engine::policy& p) override {
      return inner_.watch_workspace(run, p);
    }
    engine::task<std::optional<std::string>> start_child(storage::new_run child, const engine::policy& p) override {
      return inner_.start_child(std::move(child), p);
    }
    std::uint64_t step_count() override { return inner_.step_count(); }
    std::vector<protocol::step_result> history(std::uint64_t from, std::uint64_t until,
                                               std::uint64_t max_bytes) override {
      return inner_.history(from, until, max_bytes);
    }
    int step_failures(std::uint64_t seq) override { return inner_.step_failures(seq); }
    int tool_attempts(std::uint64_t seq) override { return inner_.tool_attempts(seq); }
    std::optional<effects::timer_set> timer_at(std::uint64_t seq) override { return inner_.timer_at(seq); }
    std::optional<effects::wait_started> wait_at(std::uint64_t seq) override { return inner_.wait_at(seq); }
    std::optional<std::string> cancel_requested() override { return inner_.cancel_requested(); }
    engine::task<void> confirm_held() override { return inner_.confirm_held(); }
    std::optional<storage::signal_record> pending_signal(const std::string& name) override {
      return inner_.pending_signal(name);
    }
    std::optional<storage::run_record> find_run(const std::string& id) override { return inner_.find_run(id); }
    std::uint64_t llm_tokens_spent() override { return inner_.llm_tokens_spent(); }

   private:
    world& sim_;
    const worker& w_;
    attempt_slot& slot_;
    engine::run_journal& inner_;
    std::string run_;
  };

  // The tools the agents call, granted to every broker (engine::grant_test_tools).
  class sim_tool final : public engine::tool {
   public:
    sim_tool(world& sim, std::string name, bool at_most_once) : sim_(sim), name_(std::move(name)), amo_(at_most_once) {}
    const std::string& name() const override { return name_; }
    engine::idempotency kind(const json&) const override {
      return amo_ ? engine::idempotency::at_most_once : engine::idempotency::idempotent;
    }
    json call(const engine::tool_call& c) override {
      sim_.check_not_prefix(c.run_id, c.seq, "its tool is called");
      // The tool's effect on the world: it happened, whatever the journal says next.
      const int n = ++sim_.tool_calls_[{c.run_id, c.seq}];
      sim_.trace(fmt::format("the {} tool of {} step {} is called ({} time)", amo_ ? "at-most-once" : "idempotent",
                             c.run_id, c.seq, n));
      if (amo_ && n > 1)
        sim_.fail(fmt::format("the at-most-once tool of {} step {} was called {} times", c.run_id, c.seq, n));
      return json{{"seq", c.seq}};
    }

   private:
    world& sim_;
    std::string name_;
    bool amo_;
  };

  std::map<std::string, std::unique_ptr<engine::tool>> make_tools() {
    std::map<std::string, std::unique_ptr<engine::tool>> tools;
    tools["charge"] = std::make_unique<sim_tool>(*this, "charge", true);
    tools["fetch"] = std::make_unique<sim_tool>(*this, "fetch", false);
    return tools;
  }

  // A violation seen where it cannot be thrown through (the engine's
  // coroutines, which catch what they expect): the first is kept, the
  // simulation ends after the event.
  void fail(std::string what) {
    if (!pending_) pending_ = std::move(what);
  }
  void check_pending() {
    if (pending_) throw violation{*pending_};
  }

  void executes(const std::string& run, const std::string& worker_tag, std::uint64_t seq) override {
    // A stale attempt (its run taken over while its worker was paused) may
    // still compute a step; the attempt that holds the run replays what was
    // acknowledged.
    auto it = holder_.find(run);
    if (acked_.count({run, seq}) && it != holder_.end() && it->second == worker_tag)
      fail(fmt::format("step {} of {} was acknowledged, yet the agent of {} executes it again", seq, run, worker_tag));
    check_not_prefix(run, seq, "the agent of " + worker_tag + " executes it");
    agent_writes(run, worker_tag, seq);
  }

  void answered(const std::string& run, const std::string& worker_tag, std::uint64_t seq, const json& output) override {
    written_ = true;  // what check() holds the journal to grew
    trace(fmt::format("the agent of {} ({}) is answered step {}", run, worker_tag, seq));
    // Each step is answered once: after that a replay hands it over.
    if (!acked_.emplace(std::make_pair(run, seq), output).second)
      fail(fmt::format("step {} of {} was answered twice (the second time to the agent of {})", seq, run, worker_tag));
  }

  // One move of one agent of any worker (a paused worker's agents go on).
  void agent_moves() {
    std::vector<std::shared_ptr<sim_agent>> agents;
    for (auto& w : workers_)
      for (auto& a : w->backend->agents()) agents.push_back(std::move(a));
    if (agents.empty()) return advance_clock();
    auto& agent = *agents[below(agents.size())];
    try {
      agent.act();
    } catch (const agent_error& e) {
      throw violation{e.what()};
    }
    check_pending();
  }

  void take_real(worker& w, const std::string& id) {
    auto a = std::make_unique<attempt_slot>();
    a->run = id;
    a->record = *w.reads->find_run(id);
    a->journal = std::make_unique<engine::run_journal>(*w.writes, *w.reads, home_, a->run, a->policy.journal);
    a->journal->open_workspaces_with(opener(a->keeper));
    a->port = std::make_unique<held_port>(*this, w, *a);
    a->wakeups = std::make_unique<sim_wakeups>(a->run, [this, run = a->run, tag = w.tag] {
      if (quiet_ || below(2) != 0) return false;
      trace(fmt::format("a wake-up of {} on {} is lost", run, tag));
      return true;
    });
    a->nudge.emplace(*a->io);
    // engine::end_before_attempt: a call in doubt stops the run.
    if (auto doubt = engine::find_in_doubt(*w.reads, id)) {
      trace(fmt::format("{} finds step {} of {} in doubt", w.tag, doubt->seq, id));
      try {
        engine::run_here(a->journal->apply(effects::run_ended{storage::run_status::in_doubt, nullptr,
                                                               protocol::error_info{doubt->message, "in_doubt"}}));
        written_ = true;
        confirm_holder(w, id);
        holder_.erase(id);
        trace(fmt::format("{} ends {}: in_doubt", w.tag, id));
      } catch (const storage::storage_error& e) {
        trace(fmt::format("{} stops driving {}: {}", w.tag, id, e.what()));
      }
      check_pending();
      return;
    }
    try {
      a->attempt = w.writes->begin_attempt(id);
      trace(fmt::format("{} begins attempt {} of {} at step {}", w.tag, a->attempt, id, a->journal->step_count()));
      confirm_holder(w, id);
    } catch (const storage::storage_error& e) {
      trace(fmt::format("{} stops driving {}: {}", w.tag, id, e.what()));
      return;
    }
    auto& slot = *a;
    w.attempts[id] = std::move(a);
    boost::asio::co_spawn(*slot.io, execute(w, slot), [this, &w, &slot](std::exception_ptr e) {
      slot.over = true;
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const storage::storage_error& refused) {
        trace(fmt::format("{} stops driving {}: {}", w.tag, slot.run, refused.what()));
      } catch (const std::exception& other) {
        fail(fmt::format("the attempt of {} on {} threw: {}", slot.run, w.tag, other.what()));
      }
    });
  }

  // The worker acts on one of its runs: its event loop runs what is ready,
  // timers whose (simulated) time has come included.
  void poll(worker& w, attempt_slot& a) {
    // A timer's time comes when the clock moves, but the event loop hears of
    // it only when its timerfd fires, up to a millisecond of real time later
    // (clock_wait_traits). A timer due at once re-arms that timerfd to fire
    // now, so every timer that is due runs in this poll, however fast the
    // simulation goes.
    // The ledger commits the effect that waits for it, if one does.
    if (auto* gate = std::exchange(a.commit_gate, nullptr)) gate->cancel();
    if (!std::exchange(a.nudging, true)) {
      a.nudge->expires_at(engine::clock::time_point{});
      a.nudge->async_wait([&a](boost::system::error_code) { a.nudging = false; });
    }
    a.io->poll();
    const auto run = a.run;
    if (a.over) w.attempts.erase(run);
    check_pending();
  }

  // What engine::execute_run does around each attempt, for one run.
  engine::task<void> execute(worker& w, attempt_slot& a) {
    using kind = engine::attempt_result::kind;
    for (;;) {
      auto result =
          co_await engine::run_attempt(*a.port, *a.wakeups, *w.backend, a.record, a.policy, a.attempt, a.options,
                                       a.observer);
      switch (result.outcome) {
        case kind::suspended: {
          co_await a.port->confirm_held();
          effects::suspended s;
          s.wait = result.wait;
          s.count = 1;
          co_await a.port->apply(std::move(s));
          holder_.erase(a.run);
          handed_back_.insert(a.run);
          trace(fmt::format("{} suspends {}", w.tag, a.run));
          co_return;
        }
        case kind::crashed:
        case kind::restart: {
          trace(fmt::format("{}: attempt {} of {} crashed: {}", w.tag, a.attempt, a.run, result.error.message));
          co_await a.port->apply(effects::attempt_crashed{a.attempt, result.error.message, true});
          if (auto doubt = engine::find_in_doubt(*w.reads, a.run)) {
            co_await a.port->apply(effects::run_ended{storage::run_status::in_doubt, nullptr,
                                                      protocol::error_info{doubt->message, "in_doubt"}});
            holder_.erase(a.run);
            trace(fmt::format("{} ends {}: in_doubt", w.tag, a.run));
            co_return;
          }
          a.attempt = co_await w.writes->begin_attempt_async(a.run);
          a.record = *w.reads->find_run(a.run);
          continue;
        }
        case kind::completed: {
          co_await a.port->apply(effects::run_ended{storage::run_status::completed, result.output, std::nullopt});
          holder_.erase(a.run);
          trace(fmt::format("{} ends {}: completed", w.tag, a.run));
          co_return;
        }
        default:
          // Its agent never fails, cancels or stops: the driver ended the attempt for a reason of its own.
          fail(fmt::format("the attempt of {} on {} ended {}: {} ({})", a.run, w.tag, static_cast<int>(result.outcome),
                           result.error.message, result.error.type));
          co_return;
      }
    }
  }

  // ---- an agent's conversation, one effect at a time ----

  void advance(worker& w, driver& d) {
    const auto& script = scripts_.at(d.run);
    // The attempt hears a cancel between effects (attempt.cpp's recheck);
    // the model's agent obeys it at once.
    if (d.port->cancel_requested())
      return finish(w, d, effects::run_ended{storage::run_status::cancelled, nullptr,
                                             protocol::error_info{"cancelled by the simulation", "cancelled"}});
    if (d.seq == script.size())
      return finish(w, d, effects::run_ended{storage::run_status::completed, json{{"steps", d.seq}}, std::nullopt});
    const op& o = script[d.seq];
    if (!d.wrote) {
      d.wrote = true;
      agent_writes(d.run, w.tag, d.seq);
      // A plain step's files, then (another event) its commit: a crash between leaves them half written.
      if (o.kind == op::step) return;
    }
    switch (o.kind) {
      case op::step: {
        // A stale attempt (its run taken over while its worker was paused)
        // may still compute a step; only its write is refused. The attempt
        // that holds the run replays what was acknowledged.
        if (acked_.count({d.run, d.seq}) && holds(w, d.run))
          throw violation{fmt::format("step {} of {} was acknowledged, yet {} executes it again", d.seq, d.run, w.tag)};
        check_not_prefix(d.run, d.seq, w.tag + " executes it");
        commit(w, d, record(d, "step", protocol::step_kind::step, json{{"run", d.run}, {"seq", d.seq}}));
        return;
      }
      case op::at_most_once:
      case op::idempotent: {
        const bool amo = o.kind == op::at_most_once;
        if (d.phase == 0) {
          effects::tool_started started{d.seq, amo ? "charge" : "fetch", amo ? "at_most_once" : "idempotent",
                                        json{{"seq", d.seq}}};
          if (apply(w, d, started)) d.phase = 1;
        } else if (d.phase == 1) {
          check_not_prefix(d.run, d.seq, "its tool is called");
          // The tool's effect on the world: it happened, whatever the journal says next.
          const int n = ++tool_calls_[{d.run, d.seq}];
          trace(fmt::format("{} calls the {} tool of {} step {} ({} time)", w.tag, amo ? "at-most-once" : "idempotent",
                            d.run, d.seq, n));
          if (amo && n > 1)
            throw violation{fmt::format("the at-most-once tool of {} step {} was called {} times", d.run, d.seq, n)};
          d.tool_output = json{{"seq", d.seq}};
          d.phase = 2;
        } else {
          commit(w, d, record(d, amo ? "charge" : "fetch", protocol::step_kind::tool, d.tool_output));
        }
        return;
      }
      case op::sleep: {
        auto timer = d.port->timer_at(d.seq);
        if (!timer) {
          if (d.phase == 1 && holds(w, d.run))
            throw violation{fmt::format("the timer of {} step {} was set, then lost", d.run, d.seq)};
          if (apply(w, d, effects::timer_set{d.seq, virtual_now + o.ms, false})) d.phase = 1;
          return;
        }
        d.phase = 1;
        // The attempt's rule (attempt_waits.cpp): a timer answers once due.
        if (engine::timer_due(virtual_now, timer->until_ms)) {
          auto r = record(d, "sleep", protocol::step_kind::sleep, nullptr);
          commit(w, d, std::move(r));
        } else if (below(2) == 0) {
          suspend(w, d, storage::wait_spec{"timer", "", d.seq, timer->until_ms});
        }
        return;
      }
      case op::child: {
        // attempt_waits.cpp's child step: the run is made (once, however
        // often a replay asks), then the step records its id.
        const auto id = child_id(d.run, d.seq);
        if (d.phase == 0) {
          storage::new_run child;
          child.id = id;
          child.agent = "/sim/agent";
          child.sandbox = "none";
          child.max_attempts = 1'000;
          child.parent_id = d.run;
          std::optional<std::string> refused;
          written_ = true;
          try {
            refused = engine::run_here(d.port->start_child(std::move(child), engine::policy{}));
          } catch (const storage::storage_error& e) {
            return dropped(w, d, e);
          }
          confirm_holder(w, d.run);
          if (refused) throw violation{fmt::format("the child {} was refused: {}", id, *refused)};
          trace(fmt::format("{} starts child {}", w.tag, id));
          d.phase = 1;
          return;
        }
        commit(w, d, record(d, child_agent(), protocol::step_kind::child, json{{"run_id", id}}));
        return;
      }
      case op::join: {
        const auto id = child_id(d.run, o.of);
        if (d.phase == 2) {
          suspend(w, d, storage::wait_spec{"child", id, d.seq, std::nullopt});
          return;
        }
        auto child = d.port->find_run(id);
        if (!child) throw violation{fmt::format("{} joins its child {}, which is not in the journal", d.run, id)};
        if (storage::is_finished(child->status)) {
          const json out = child->status == storage::run_status::completed
                               ? child->output
                               : json{{"error", storage::to_string(child->status)}};
          commit(w, d, record(d, child_id(d.run, o.of), protocol::step_kind::join, out));
        } else if (below(2) == 0) {
          d.phase = 2;
        }
        return;
      }
      case op::signal: {
        const auto name = signal_name(d.seq);
        if (!d.port->wait_at(d.seq)) {
          apply(w, d, effects::wait_started{d.seq, name, std::nullopt});
          return;
        }
        // The attempt looks for the signal, then (a later event: its hold
        // gives up) suspends without looking again. A signal sent between
        // must still wake the run (engine::wait_is_over).
        if (d.phase == 2) {
          suspend(w, d, storage::wait_spec{"signal", name, d.seq, std::nullopt});
          return;
        }
        if (auto s = d.port->pending_signal(name)) {
          commit(w, d, record(d, "wait " + name, protocol::step_kind::signal, s->payload),
                 effects::delivered_signal{s->id, name});
        } else if (below(2) == 0) {
          d.phase = 2;
        }
        return;
      }
    }
  }

  storage::step_record record(const driver& d, std::string name, protocol::step_kind kind, json output) const {
    storage::step_record r;
    r.run_id = d.run;
    r.result.seq = d.seq;
    r.result.name = std::move(name);
    r.result.kind = kind;
    r.result.output = std::move(output);
    r.started_at_ms = r.finished_at_ms = virtual_now;
    return r;
  }

  void commit(worker& w, driver& d, storage::step_record r, std::optional<effects::delivered_signal> signal = {}) {
    const auto seq = d.seq;
    const auto output = r.result.output;
    // attempt_driver::commit: what the step changed goes with it.
    std::optional<engine::workspace_checkpoint> checkpoint;
    if (d.keeper) checkpoint = d.keeper->take();
    if (!apply(w, d, effects::step_committed{std::move(r), signal, 0, std::move(checkpoint)})) return;
    if (d.fake) committed(d.run, seq, d.fake->taken());
    // The agent is answered: from now on the step is the user's.
    acked_[{d.run, seq}] = output;
    if (signal) {
      const int n = ++deliveries_[signal->id];
      if (n > 1) throw violation{fmt::format("signal {} of {} was delivered {} times", signal->id, d.run, n)};
    }
    trace(fmt::format("{} commits {} step {}", w.tag, d.run, seq));
    ++d.seq;
    d.phase = 0;
    d.wrote = false;
  }

  void suspend(worker& w, driver& d, storage::wait_spec wait) {
    effects::suspended s;
    s.wait = std::move(wait);
    s.count = 1;
    const auto run = d.run;
    if (!apply(w, d, std::move(s))) return;
    holder_.erase(run);
    handed_back_.insert(run);
    trace(fmt::format("{} suspends {}", w.tag, run));
    w.drivers.erase(run);
  }

  void finish(worker& w, driver& d, effects::run_ended end) {
    const auto run = d.run;
    const auto status = end.status;
    if (!apply(w, d, std::move(end))) return;
    holder_.erase(run);
    trace(fmt::format("{} ends {}: {}", w.tag, run, storage::to_string(status)));
    w.drivers.erase(run);
    // engine::end_run's cancel_children.
    for (const auto& child : w.reads->children(run)) {
      if (storage::is_finished(child.status)) continue;
      try {
        w.writes->request_cancel(child.id, fmt::format("its parent run {} ended", run));
        trace(fmt::format("{} cancels {}", w.tag, child.id));
      } catch (const storage::storage_error& e) {
        trace(fmt::format("{} cannot cancel {}: {}", w.tag, child.id, e.what()));
      }
    }
  }

  // One effect through the attempt's journal port; false when it was not
  // written (the driver is gone then).
  bool apply(worker& w, driver& d, engine::effect e) {
    written_ = true;
    touched_.insert(d.run);
    try {
      engine::run_here(d.port->apply(std::move(e)));
    } catch (const storage::storage_error& e) {
      dropped(w, d, e);
      return false;
    }
    confirm_holder(w, d.run);
    return true;
  }

  bool holds(const worker& w, const std::string& run) const {
    auto it = holder_.find(run);
    return it != holder_.end() && it->second == w.tag;
  }

  // Only the worker that took a run last may write to it.
  void confirm_holder(const worker& w, const std::string& run) {
    auto it = holder_.find(run);
    if (it == holder_.end() || it->second != w.tag)
      throw violation{fmt::format("{} wrote to {}, which {} holds now: two workers execute one run",
                                  w.tag, run, it == holder_.end() ? "nobody" : it->second)};
  }

  void dropped(worker& w, driver& d, const storage::storage_error& e) {
    const auto run = d.run;
    if (e.code() == storage::errc::fenced) {
      auto it = holder_.find(run);
      if (it != holder_.end() && it->second == w.tag)
        throw violation{fmt::format("{} was fenced off {}, which it holds: {}", w.tag, run, e.what())};
    }
    trace(fmt::format("{} stops driving {}: {}", w.tag, run, e.what()));
    w.drivers.erase(run);
  }

  // ---- workspaces: checkpoints and forks ----

  // What run_journal::watch_workspace opens an attempt's workspace with:
  // a fake_keeper over the run's files. After a crash (the sim's own view:
  // the attempt before did not hand the run back) the files must be the
  // last committed step's, whatever the engine decided to roll back.
  engine::workspace_opener opener(fake_keeper*& keeper) {
    return [this, &keeper](engine::workspace_opening o) {
      const auto& run = o.run.id;
      folder_of_[run] = o.run.workspace;
      auto& now = workspaces_[o.run.workspace];
      // The engine's roll-back reads pieces through a connection of its own,
      // which o.pieces opens by the journal's path; the in-memory journal's
      // has none to open, and the simulation's database gives one.
      auto own = db_->open();
      auto k = std::make_unique<fake_keeper>(now, engine::pieces_of(*own), std::move(o.state), o.roll_back,
                                             o.budget_bytes, o.spent_bytes);
      keeper = k.get();
      if (k->rolled_back() > 0) trace(fmt::format("{} files of {} are rolled back", k->rolled_back(), run));
      const bool after_crash = !attempted_.insert(run).second && !handed_back_.count(run);
      handed_back_.erase(run);
      if (after_crash) check_rolled_back(run, now);
      const auto rolled_back = k->rolled_back();
      return engine::opened_workspace{std::move(k), rolled_back};
    };
  }

  void check_rolled_back(const std::string& run, const files& now) {
    const auto steps = observer_->step_count(run);
    const files* want = nullptr;
    if (steps > 0) {
      if (auto it = committed_.find({run, steps - 1}); it != committed_.end()) want = &it->second.held;
    } else if (auto it = baseline_files_.find(run); it != baseline_files_.end()) {
      static constexpr std::string_view baseline[] = {engine::baseline_event};
      if (!observer_->events_of_kinds(run, baseline).empty()) want = &it->second;
    }
    if (want && *want != now)
      fail(fmt::format("an attempt of {} after a crash begins on {} files, not the {} that step {} committed", run,
                       now.size(), want->size(), steps == 0 ? std::string("baseline") : std::to_string(steps - 1)));
  }

  // The agent of `run`, at the step `seq` it executes, writes or deletes
  // files: at once, long before its step commits.
  void agent_writes(const std::string& run, const std::string& who, std::uint64_t seq) {
    auto folder = folder_of_.find(run);
    if (folder == folder_of_.end()) return;
    auto& now = workspaces_[folder->second];
    std::string did;
    for (auto n = 1 + below(2); n > 0; --n) {
      const auto path = fmt::format("f{}", below(5));
      if (now.count(path) && below(4) == 0) {
        now.erase(path);
        did += " -" + path;
      } else {
        // Some bytes two files or runs share: one piece, stored once.
        now[path] = below(3) == 0 ? fmt::format("shared {}", below(3))
                                  : fmt::format("{} step {} by {}: {}", run, seq, who, below(1'000'000));
        did += " +" + path;
      }
    }
    trace(fmt::format("the agent of {} writes{}", run, did));
  }

  void committed(const std::string& run, std::uint64_t seq, const files& f) {
    committed_[{run, seq}] = {f, state_of(f)};
  }

  // A fork's prefix is replayed, never executed.
  void check_not_prefix(const std::string& run, std::uint64_t seq, const std::string& what) {
    auto it = prefix_.find(run);
    if (it != prefix_.end() && seq <= it->second)
      fail(fmt::format("step {} of the fork {} is of its prefix, yet {}", seq, run, what));
  }

  // Every committed step's files are what the journal's checkpoints up to
  // it fold to (as engine::checkpoint_state folds them for `cairn workspace
  // --at`: the baseline, then each checkpoint in order; here once for all
  // of a run's steps). Of the runs an event wrote to (touched_), or all.
  void check_checkpoints(bool all = false) {
    static constexpr std::string_view kinds[] = {engine::checkpoint_event, engine::baseline_event};
    for (auto it = committed_.begin(); it != committed_.end();) {
      const auto run = it->first.first;
      if (!all && !touched_.count(run)) {
        it = committed_.lower_bound({run + '\0', 0});
        continue;
      }
      const auto events = observer_->events_of_kinds(run, kinds);
      engine::workspace_state folded;
      for (const auto& e : events)
        if (e.kind == engine::baseline_event) engine::apply_checkpoint(folded, e.data);
      auto next = events.begin();
      for (; it != committed_.end() && it->first.first == run; ++it) {
        const auto seq = it->first.second;
        for (; next != events.end() && (!next->seq || *next->seq <= seq); ++next)
          if (next->kind == engine::checkpoint_event) engine::apply_checkpoint(folded, next->data);
        if (folded != it->second.state)
          throw violation{fmt::format("the checkpoints of {} up to step {} are not the files it committed ({})", run,
                                      seq, fmt::join(describe(it->second.held), " "))};
      }
    }
    touched_.clear();
  }

  static std::vector<std::string> describe(const files& f) {
    std::vector<std::string> out;
    for (const auto& [path, bytes] : f) out.push_back(path + "=" + bytes);
    return out;
  }

  // After a power cut: no checkpoint without its pieces, no committed step
  // without its checkpoint.
  void check_checkpoints_kept() {
    static constexpr std::string_view kinds[] = {engine::checkpoint_event, engine::baseline_event};
    std::set<std::string> runs;
    for (const auto& [key, c] : committed_) runs.insert(key.first);
    for (const auto& run : runs) {
      for (const auto& e : observer_->events_of_kinds(run, kinds)) {
        // Named: items() refers to the object, which a temporary would take with it.
        const json files = e.data.value("files", json::object());
        for (const auto& [path, entry] : files.items()) {
          const json pieces = entry.value("p", json::array());
          for (const auto& digest : pieces)
            if (!observer_->find_blob(digest.get<std::string>()))
              throw violation{fmt::format("the checkpoint of {} at step {} names {} of {}, which the journal lost",
                                          run, e.seq.value_or(0), digest.get<std::string>(), path)};
        }
      }
    }
    check_checkpoints(true);
  }

  // `cairn fork` of a run (engine::write_fork, the journal's side of
  // engine::fork), into the simulation's workspaces. With journal faults
  // off: a fork half made by a failing write is `cairn fork`'s to report.
  void fork_one() {
    if (faulty_) return advance_clock();
    written_ = true;
    // A run with a child step is not forked: its fork's join would wait for a child of its own.
    std::vector<std::string> candidates;
    for (const auto& [id, script] : scripts_)
      if (id.find('.') == std::string::npos &&
          std::none_of(script.begin(), script.end(), [](const op& o) { return o.kind == op::child; }))
        candidates.push_back(id);
    if (candidates.empty()) return advance_clock();
    const auto origin = candidates[below(candidates.size())];
    const auto from = observer_->find_run(origin);
    const auto steps = observer_->step_count(origin);
    const auto r = below(8);
    if (steps == 0 || r == 0) return fork_refused(origin, steps + below(2), fmt::format("f{}", forks_ + 1));
    if (r == 1) return fork_refused(origin, below(steps), candidates[below(candidates.size())]);
    const auto seq = below(steps);
    const auto id = fmt::format("f{}", ++forks_);
    storage::new_run run;
    run.id = id;
    run.agent = from->agent;
    run.input = from->input;
    run.sandbox = from->sandbox;
    run.policy = from->policy;
    run.workspace = "/sim/" + id;
    run.max_attempts = from->max_attempts;
    auto journal = db_->open();
    engine::fork_written written;
    try {
      written = engine::write_fork(*signaller_, *journal, run, origin, seq, false, "sim-fork:boot:1:1",
                                   [&](const std::optional<engine::workspace_state>& state) {
                                     auto& now = workspaces_[run.workspace];
                                     if (state) now = files_of(engine::pieces_of(*journal), *state);
                                   });
    } catch (const std::exception& e) {
      throw violation{fmt::format("fork {} of {} at step {} failed: {}", id, origin, seq, e.what())};
    }
    if (written.refused)
      throw violation{fmt::format("fork {} of {} at step {} of {} was refused: {}", id, origin, seq, steps,
                                  *written.refused)};
    trace(fmt::format("fork {} of {} at step {}{}", id, origin, seq, written.restored ? ", its files restored" : ""));
    scripts_[id] = scripts_.at(origin);
    prefix_[id] = seq;
    for (auto it = committed_.lower_bound({origin, 0}); it != committed_.end() && it->first.first == origin &&
                                                        it->first.second <= seq;
         ++it)
      committed_[{id, it->first.second}] = it->second;
    for (auto it = acked_.lower_bound({origin, 0}); it != acked_.end() && it->first.first == origin &&
                                                    it->first.second <= seq;
         ++it)
      acked_[{id, it->first.second}] = it->second;
    if (auto b = baseline_files_.find(origin); b != baseline_files_.end()) baseline_files_[id] = b->second;
    touched_.insert(origin);
    touched_.insert(id);
    check_fork(origin, id, seq);
  }

  // The fork's journal is its origin's up to seq, its files the origin's checkpoint there, byte for byte.
  void check_fork(const std::string& origin, const std::string& fork, std::uint64_t seq) {
    const auto mine = observer_->steps(fork);
    const auto theirs = observer_->steps(origin);
    if (mine.size() != seq + 1) throw violation{fmt::format("fork {} of {} at {} has {} steps", fork, origin, seq, mine.size())};
    for (std::size_t i = 0; i <= seq; ++i)
      if (protocol::to_json(mine[i].result) != protocol::to_json(theirs[i].result))
        throw violation{fmt::format("step {} of fork {} is not step {} of {}", i, fork, i, origin)};
    std::vector<storage::event_record> kept, copied;
    for (const auto& e : observer_->events(origin))
      if (e.seq && *e.seq <= seq) kept.push_back(e);
    for (const auto& e : observer_->events(fork))
      if (e.seq) copied.push_back(e);
    const bool same = std::equal(kept.begin(), kept.end(), copied.begin(), copied.end(), [](const auto& a, const auto& b) {
      return a.kind == b.kind && a.seq == b.seq && a.data == b.data;
    });
    if (!same) throw violation{fmt::format("the events of fork {} are not those of {} up to step {}", fork, origin, seq)};
    const auto& now = workspaces_[folder_of_fork(fork)];
    const auto at = files_of(engine::pieces_of(*observer_), engine::checkpoint_state(*observer_, origin, seq));
    if (now != at)
      throw violation{fmt::format("fork {} holds {} files, not the {} of the checkpoint of {} at step {}", fork,
                                  now.size(), at.size(), origin, seq)};
    if (auto it = committed_.find({origin, seq}); it != committed_.end() && it->second.held != now)
      throw violation{fmt::format("fork {} holds files that step {} of {} did not commit", fork, seq, origin)};
  }

  static std::string folder_of_fork(const std::string& fork) { return "/sim/" + fork; }

  // A fork past the end of `origin`, or into a run that exists, is refused and changes nothing.
  void fork_refused(const std::string& origin, std::uint64_t seq, const std::string& id) {
    const auto existed = observer_->find_run(id);
    const auto events_before = observer_->events(origin).size();
    const auto steps_of_id = existed ? observer_->step_count(id) : 0;
    storage::new_run run;
    run.id = id;
    run.agent = "/sim/agent";
    run.sandbox = "none";
    run.workspace = folder_of_fork(id);
    auto journal = db_->open();
    bool filled = false;
    engine::fork_written written;
    try {
      written = engine::write_fork(*signaller_, *journal, run, origin, seq, false, "sim-fork:boot:1:1",
                                   [&](const auto&) { filled = true; });
    } catch (const std::exception& e) {
      throw violation{fmt::format("fork {} of {} at step {} threw: {}", id, origin, seq, e.what())};
    }
    const bool past_end = seq >= observer_->step_count(origin);
    if (!written.refused && (existed || past_end))
      throw violation{fmt::format("fork {} of {} at step {} was made: {}", id, origin, seq,
                                  existed ? "the id exists" : "past the end")};
    if (!written.refused) throw violation{fmt::format("fork {} of {} at {}: the simulation meant a refusal", id, origin, seq)};
    trace(fmt::format("fork {} of {} at step {} refused: {}", id, origin, seq, *written.refused));
    const auto after = observer_->find_run(id);
    if (filled || observer_->events(origin).size() != events_before || bool(after) != bool(existed) ||
        (existed && (after->status != existed->status || after->owner != existed->owner ||
                     observer_->step_count(id) != steps_of_id)))
      throw violation{fmt::format("the refused fork {} of {} at step {} changed the journal", id, origin, seq)};
  }

  // ---- what users rely on ----

  // After every event: every acknowledged step is in the journal as it was
  // acknowledged (a power cut keeps what was synced, and only acknowledged
  // steps were synced first).
  void check() {
    for (auto it = acked_.begin(); it != acked_.end();) {
      const auto& run = it->first.first;
      const auto steps = observer_->steps(run);
      for (; it != acked_.end() && it->first.first == run; ++it) {
        const auto seq = it->first.second;
        const auto found = std::find_if(steps.begin(), steps.end(), [&](const auto& s) { return s.result.seq == seq; });
        if (found == steps.end())
          throw violation{fmt::format("acknowledged step {} of {} is not in the journal", seq, run)};
        if (found->result.output != it->second)
          throw violation{fmt::format("acknowledged step {} of {} changed: {} became {}", seq, run, it->second.dump(),
                                      found->result.output.dump())};
      }
    }
    check_checkpoints();
    check_pending();
  }

  void check_acknowledged_signals() {
    for (const auto& [run, ids] : acked_signals_) {
      std::set<std::int64_t> kept;
      for (const auto& s : observer_->signals(run)) kept.insert(s.id);
      for (auto id : ids)
        if (!kept.count(id)) throw violation{fmt::format("acknowledged signal {} of {} is not in the journal", id, run)};
    }
  }

  bool ended(storage::run_status s) const { return storage::is_finished(s) || s == storage::run_status::in_doubt; }

  // A child whose parent ended before starting it never exists.
  bool all_ended() {
    for (const auto& [id, script] : scripts_) {
      auto run = observer_->find_run(id);
      if (run && !ended(run->status)) return false;
    }
    return true;
  }

  int ended_runs() {
    int n = 0;
    if (!observer_) return n;
    for (const auto& [id, script] : scripts_) {
      auto run = observer_->find_run(id);
      if (run && ended(run->status)) ++n;
    }
    return n;
  }

  [[noreturn]] void liveness_failed() {
    std::string stuck;
    for (const auto& [id, script] : scripts_) {
      auto run = observer_->find_run(id);
      if (run && !ended(run->status))
        stuck += fmt::format(" {} is {} at step {} of {} (owner '{}')", id, storage::to_string(run->status),
                             observer_->step_count(id), script.size(), run->owner);
    }
    throw violation{"liveness: faults stopped, yet runs did not end:" + stuck};
  }

  // Once every run ended: a completed run made every step once, its timers
  // fired no earlier than set, each of its signals was delivered once.
  void check_ends() {
    check_acknowledged_signals();
    for (const auto& [id, script] : scripts_) {
      auto run = observer_->find_run(id);
      if (!run) {
        const auto dot = id.rfind('.');
        auto parent = dot == std::string::npos ? std::nullopt : observer_->find_run(id.substr(0, dot));
        if (!parent || parent->status == storage::run_status::completed)
          throw violation{fmt::format("{} is not in the journal, yet its parent completed", id)};
        continue;
      }
      // (A call in doubt stops a run before its cancel does: the user settles it first.)
      if (cancelled_.count(id) && run->status != storage::run_status::cancelled &&
          run->status != storage::run_status::in_doubt)
        throw violation{fmt::format("{} ended {}, yet its cancel was acknowledged before it ended", id,
                                    storage::to_string(run->status))};
      if (run->status != storage::run_status::completed) continue;
      const auto steps = observer_->steps(id);
      if (steps.size() != script.size())
        throw violation{fmt::format("{} completed with {} steps of {}", id, steps.size(), script.size())};
      for (const auto& s : steps) {
        const op& o = script[s.result.seq];
        if (o.kind == op::join) {
          // A join records how its child ended, as the child's run says.
          auto child = observer_->find_run(child_id(id, o.of));
          const json out = child->status == storage::run_status::completed
                               ? child->output
                               : json{{"error", storage::to_string(child->status)}};
          if (s.result.output != out)
            throw violation{fmt::format("{} step {} joined {} as {}, yet it ended {}", id, s.result.seq,
                                        child_id(id, o.of), s.result.output.dump(), out.dump())};
        }
        if (o.kind != op::sleep) continue;
        // The timer as its event recorded it (the kept state speaks only of the next step).
        std::optional<std::int64_t> until;
        for (const auto& e : observer_->events_at(id, s.result.seq))
          if (e.kind == "timer_set") until = e.data.at("until_ms").get<std::int64_t>();
        if (!until) throw violation{fmt::format("{} step {} slept without a timer in the journal", id, s.result.seq)};
        if (s.finished_at_ms < *until)
          throw violation{fmt::format("the timer of {} step {} fired early: at {}, set for {}", id, s.result.seq,
                                      s.finished_at_ms, *until)};
      }
    }
  }

  void trace(const std::string& line) override {
    for (unsigned char c : line) hash_ = (hash_ ^ c) * 0x100000001b3ULL;
    hash_ = (hash_ ^ '\n') * 0x100000001b3ULL;
    if (o_.verbose) std::cerr << fmt::format("{:>6} {:>9} {}\n", events_, virtual_now - epoch_ms, line);
  }

  options o_;
  std::mt19937_64 rng_;
  bool real_;  // --driver real
  std::optional<engine::fake_clock> clock_;  // the engine's, with --driver real
  std::optional<std::string> pending_;  // a violation seen inside the engine's coroutines
  std::unique_ptr<database> db_;
  std::unique_ptr<engine::ledger> signaller_;  // `cairn signal` and `cairn submit`: a process of their own
  std::unique_ptr<storage::journal> observer_;  // the simulator's own view of the journal
  std::vector<std::unique_ptr<worker>> workers_;
  const int slots_ = 2 + static_cast<int>(rng_() % 2);
  int incarnations_ = 0;
  std::filesystem::path home_ = "/sim/home";
  std::map<std::string, std::vector<op>> scripts_;
  // The truth outside the journal.
  std::map<std::pair<std::string, std::uint64_t>, json> acked_;  // steps whose agent was answered
  std::map<std::pair<std::string, std::uint64_t>, int> tool_calls_;
  std::map<std::int64_t, int> deliveries_;
  std::set<std::pair<std::string, std::uint64_t>> sent_;
  std::map<std::string, std::set<std::int64_t>> acked_signals_;
  std::set<std::string> cancelled_;  // runs whose cancel was acknowledged before they ended
  std::map<std::string, std::string> holder_;  // run -> the worker whose claim is the latest
  // The workspaces, by folder; each run's folder; what a step's files were as it committed (the keeper's
  // take: what the agent had written), and the baseline's.
  struct committed_files {
    files held;
    engine::workspace_state state;  // as a checkpoint records them
  };
  std::map<std::string, files> workspaces_;
  std::map<std::string, std::string> folder_of_;
  std::map<std::pair<std::string, std::uint64_t>, committed_files> committed_;
  std::map<std::string, files> baseline_files_;
  std::set<std::string> attempted_;    // runs an attempt began on
  std::set<std::string> handed_back_;  // runs whose last attempt suspended them
  std::map<std::string, std::uint64_t> prefix_;  // a fork's last step of its origin's
  std::set<std::string> touched_;  // runs the event wrote to (whose checkpoints check() folds)
  int forks_ = 0;
  bool quiet_ = false, faulty_ = false;
  bool written_ = false;  // the event may have changed the journal (it wrote, or the power went)
  std::uint64_t events_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace

outcome simulate(const options& o) {
  world w(o);
  return w.run();
}

}  // namespace cairn::sim
