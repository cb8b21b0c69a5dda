// Whether a run's owner still holds it, now that owners may be workers with
// leases (storage::worker_record) as well as plain processes. One rule for
// every place that decides "the owner is dead, take the run":
//   - the owner has a worker row whose lease has expired: dead, even if its
//     process still exists here (paused or cut off: the epoch fence refuses
//     its writes once the run is taken over);
//   - a worker row with a current lease: alive, on any machine, unless it
//     is a process of this machine that is gone (owner.hpp's check);
//   - no row (`cairn run`, which registers no worker, or a journal from
//     before workers): the process check of owner.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "engine/owner.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

// The rule above for one owner and its worker row (if any), at `now_ms`.
owner_state owner_liveness(std::string_view owner, const std::optional<storage::worker_record>& worker,
                           std::int64_t now_ms);

// The rule for one owner, reading its worker row.
owner_state check_owner(storage::journal& journal, std::string_view owner);

// The workers' leases read once (a scheduling pass), to judge many owners.
class worker_leases {
 public:
  explicit worker_leases(storage::journal& journal);
  owner_state check(std::string_view owner) const;
  // When the lease of `owner` expires, if it is a worker with a current lease.
  std::optional<std::int64_t> expiry(std::string_view owner) const;
  // Whether any worker is alive by the rule above.
  bool any_alive() const;

 private:
  std::int64_t read_at_ms_;
  std::unordered_map<std::string, storage::worker_record> workers_;
};

}  // namespace cairn::engine
