#include "engine/scheduler.hpp"

#include <poll.h>

#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "engine/io.hpp"
#include "engine/liveness.hpp"
#include "engine/owner.hpp"

namespace cairn::engine {
namespace {

constexpr auto error_pause = std::chrono::seconds(5);
// Looking again at a journal out of reach: from first_outage_pause, doubled each time, up to max_outage_pause.
constexpr auto first_outage_pause = std::chrono::milliseconds(250);
constexpr auto max_outage_pause = std::chrono::seconds(5);

// Errors that pass: the journal is there but does not answer now.
bool out_of_reach(const storage::storage_error& e) {
  return e.code() == storage::errc::io || e.code() == storage::errc::locked;
}
// Event loops, one thread each, however many runs are live.
constexpr int max_lanes = 4;

}  // namespace

// Lanes: each an event loop on one thread with its own journal connection
// (to read) and engine (an engine makes its sandbox backends once), carrying
// any number of runs as coroutines; all write through one ledger.
struct scheduler::pool {
  struct lane {
    asio::io_context io;
    asio::executor_work_guard<asio::io_context::executor_type> open{io.get_executor()};
    std::unique_ptr<storage::journal> journal;
    std::unique_ptr<engine> eng;
    std::size_t live = 0;  // under the pool's mutex
    std::thread thread;
  };

  mutable std::mutex mutex;
  std::condition_variable returned;
  std::set<std::string> in_flight;
  std::map<std::string, clock::time_point> resting;  // run -> not before
  std::vector<std::unique_ptr<lane>> lanes;
  wake_event loop;  // the scheduling thread's: an execution returned, or a run changed

  // Starts run `id` on the lane that carries the fewest. Under `mutex`.
  void start(const std::string& id, const scheduler_options& options) {
    auto& l = **std::min_element(lanes.begin(), lanes.end(), [](auto& a, auto& b) { return a->live < b->live; });
    ++l.live;
    in_flight.insert(id);
    asio::co_spawn(l.io, execute(l, id, options), asio::detached);
  }

  task<void> execute(lane& l, std::string id, const scheduler_options& options) {
    std::string error;
    try {
      if (!l.journal) {
        l.journal = storage::open_journal(options.db, options.journal);
        l.eng = std::make_unique<engine>(*l.journal, options.engine);
      }
      auto* observer = options.observer_for ? options.observer_for(id) : nullptr;
      auto end = co_await l.eng->execute_async(id, observer, /*revive_failed=*/false);
      if (options.on_return) options.on_return(end);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty() && options.on_error) options.on_error(id, error);
    std::lock_guard lock(mutex);
    --l.live;
    in_flight.erase(id);
    if (!error.empty()) resting[id] = clock::now() + error_pause;
    returned.notify_all();
    loop.signal();
  }
};

scheduler::scheduler(scheduler_options options) : options_(std::move(options)), pool_(std::make_unique<pool>()) {
  options_.engine.stopping = &stopping_;
  // One writer for all lanes: their runs' steps share group commits.
  if (!options_.engine.ledger) options_.engine.ledger = std::make_shared<ledger>(options_.db, options_.journal);
  if (options_.max_concurrent < 1) options_.max_concurrent = 1;
  const int lanes = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, max_lanes);
  for (int i = 0; i < std::min(lanes, options_.max_concurrent); ++i) {
    auto l = std::make_unique<pool::lane>();
    l->thread = std::thread([io = &l->io] { io->run(); });
    pool_->lanes.push_back(std::move(l));
  }
}

scheduler::~scheduler() {
  stopping_ = true;
  wake_all();
  // Runs in flight see stopping_ and hand their runs back; then each loop runs dry.
  for (auto& l : pool_->lanes) l->open.reset();
  for (auto& l : pool_->lanes) l->thread.join();
}

std::size_t scheduler::busy() const {
  std::lock_guard lock(pool_->mutex);
  return pool_->in_flight.size();
}

schedule_pass choose_runs(storage::journal& journal, std::string_view me, std::string_view host, std::int64_t now_ms,
                          std::size_t room, const std::function<bool(const storage::run_brief&)>& passed_over) {
  schedule_pass pass;
  if (room == 0) return pass;
  const worker_leases leases(journal);
  for (auto& brief : journal.schedulable(now_ms)) {
    if (!brief.workspace_host.empty() && brief.workspace_host != host) continue;
    if (passed_over && passed_over(brief)) continue;
    const bool held = brief.status != storage::run_status::waiting && !brief.owner.empty() && brief.owner != me;
    if (held && leases.check(brief.owner) != owner_state::dead) {
      if (auto expiry = leases.expiry(brief.owner))
        pass.next_expiry_ms = std::min(pass.next_expiry_ms.value_or(*expiry), *expiry);
      continue;
    }
    pass.start.push_back(std::move(brief));
    if (pass.start.size() == room) break;
  }
  return pass;
}

// Starts every run that may start now; returns when to look again, or
// nullopt when `done` says so.
std::optional<clock::time_point> scheduler::look(
    storage::journal& journal, const std::string& me, const std::function<bool(storage::journal&)>& done) {
  {
    std::lock_guard lock(pool_->mutex);
    if (pool_->in_flight.empty() && done && done(journal)) return std::nullopt;
  }
  const auto now_ms = storage::now_ms();
  std::size_t room = 0;
  {
    std::lock_guard lock(pool_->mutex);
    const auto busy = pool_->in_flight.size();
    room = busy < static_cast<std::size_t>(options_.max_concurrent) ? options_.max_concurrent - busy : 0;
  }
  const auto pass = choose_runs(journal, me, current_owner().hostname, now_ms, room, [&](const storage::run_brief& brief) {
    std::lock_guard lock(pool_->mutex);
    if (pool_->in_flight.count(brief.id)) return true;
    if (auto rest = pool_->resting.find(brief.id); rest != pool_->resting.end()) {
      if (clock::now() < rest->second) return true;
      pool_->resting.erase(rest);
    }
    return options_.accept && !options_.accept(brief);
  });
  {
    std::lock_guard lock(pool_->mutex);
    for (const auto& brief : pass.start) pool_->start(brief.id, options_);
  }
  // A run held under a lease is looked at again when the lease would expire.
  const auto& next_expiry = pass.next_expiry_ms;
  // Until something happens, the next timer or deadline comes due, a run
  // that failed to execute may be tried again, or the idle check.
  auto until = clock::now() + options_.idle_check;
  if (auto due = journal.next_due_ms(now_ms))
    until = std::min(until, clock::now() + std::chrono::milliseconds(*due - storage::now_ms()));
  if (next_expiry)
    until = std::min(until, clock::now() + std::chrono::milliseconds(*next_expiry + 1 - storage::now_ms()));
  {
    std::lock_guard lock(pool_->mutex);
    for (const auto& [id, not_before] : pool_->resting)
      if (not_before > clock::now()) until = std::min(until, not_before);
  }
  return until;
}

void scheduler::note(const std::string& line) const {
  if (options_.on_note) options_.on_note(line);
}

void scheduler::run(const std::function<bool(storage::journal&)>& done, const stop_flag& stop) {
  auto journal = storage::open_journal(options_.db, options_.journal);
  const std::string me = current_owner().str();
  wake_registration any_run("", pool_->loop);
  wake_listening listening(options_.db);
  std::optional<worker_lease> lease;
  if (options_.lease)
    lease.emplace(*options_.engine.ledger, pool_->lanes.front()->io, *options_.lease,
                  [this] {
                    // Every run in flight checks at its wake-up that it still holds its run.
                    std::vector<std::string> live;
                    {
                      std::lock_guard lock(pool_->mutex);
                      live.assign(pool_->in_flight.begin(), pool_->in_flight.end());
                    }
                    note(fmt::format("this worker's lease had expired (was it paused, or cut off from the journal?); its {} run{} in flight "
                                     "give up any that another worker took",
                                     live.size(), live.size() == 1 ? "" : "s"));
                    for (const auto& id : live) wake_run(id);
                  },
                  options_.on_note);
  // Since when the journal has been out of reach, and the pause before looking again.
  std::optional<clock::time_point> out_since;
  auto pause = first_outage_pause;
  while (!stop.raised()) {
    // Before looking: a wake-up that comes while we look is kept for the wait below.
    pool_->loop.take();
    clock::time_point until;
    try {
      const auto next = look(*journal, me, done);
      if (!next) break;
      until = *next;
      if (out_since) {
        note(fmt::format("the journal answers again after {:.1f} s; runs it interrupted go on from their journals",
                         std::chrono::duration<double>(clock::now() - *out_since).count()));
        out_since.reset();
        pause = first_outage_pause;
      }
    } catch (const storage::storage_error& e) {
      if (!out_of_reach(e)) throw;
      if (!out_since) {
        out_since = clock::now();
        note(fmt::format("the journal is out of reach ({}); this worker waits for it, looking again every few "
                         "seconds",
                         e.what()));
      }
      until = clock::now() + pause;
      pause = std::min<std::chrono::milliseconds>(pause * 2, max_outage_pause);
    }
    std::array<pollfd, 2> events{pollfd{pool_->loop.fd(), POLLIN, 0}, pollfd{stop.fd(), POLLIN, 0}};
    if (::poll(events.data(), events.size(), poll_timeout(until)) < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "poll in the scheduler");
  }
  stopping_ = true;
  wake_all();  // attempts that wait see stopping_ now
  {
    std::unique_lock lock(pool_->mutex);
    pool_->returned.wait(lock, [&] { return pool_->in_flight.empty(); });
  }
  lease.reset();  // after the runs were handed back
}

}  // namespace cairn::engine
