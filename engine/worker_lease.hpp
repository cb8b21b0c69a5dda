// A `cairn serve` as one of many workers sharing a journal: its row in the
// journal's workers (storage::worker_record), held under a lease it renews.
// While the lease is current no other worker takes its runs; once it has
// expired any may (engine/liveness.hpp), and the epoch fence refuses every
// later write of this one to a run taken over.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <string>

#include "engine/io.hpp"
#include "engine/ledger.hpp"

namespace cairn::engine {

struct lease_settings {
  std::chrono::milliseconds lease{15'000};
  std::string workspace_root;  // "" or the shared folder this worker makes workspaces in
};

class worker_lease {
 public:
  // Registers this process (id current_owner().str(), host its hostname) and
  // renews its lease every third of `settings.lease` on `io`, reporting
  // writes.fenced_writes() each time. When a renewal comes too late (the
  // lease had expired: the process was paused or cut off, and its runs may
  // have been taken), calls `lost` on `io` and registers afresh. `report`
  // gets one line when renewals start failing to reach the journal, and
  // one when a renewal succeeds again.
  // `writes` and `io` must outlive it.
  worker_lease(ledger& writes, asio::io_context& io, lease_settings settings, std::function<void()> lost,
               std::function<void(const std::string&)> report);
  // Stops renewing and removes the row: call once this worker's runs were
  // handed back. Never throws (a row left behind expires with its lease).
  ~worker_lease();
  worker_lease(const worker_lease&) = delete;
  worker_lease& operator=(const worker_lease&) = delete;

  const std::string& id() const { return record_.id; }

 private:
  task<void> renew();
  storage::worker_record fresh_record() const;

  ledger& writes_;
  asio::io_context& io_;
  lease_settings settings_;
  std::function<void()> lost_;
  std::function<void(const std::string&)> report_;
  storage::worker_record record_;
  std::atomic<bool> stopping_{false};
  timer timer_;
  std::promise<void> stopped_;
};

}  // namespace cairn::engine
