#include "engine/liveness.hpp"

#include <algorithm>

namespace cairn::engine {

owner_state owner_liveness(std::string_view owner, const std::optional<storage::worker_record>& worker,
                           std::int64_t now_ms) {
  if (!worker || worker->lease_expires_at_ms <= now_ms) return worker ? owner_state::dead : check_owner(owner);
  // A current lease, but a process of this machine that is gone (killed)
  // writes nothing more: no need to wait out its lease.
  return check_owner(owner) == owner_state::dead ? owner_state::dead : owner_state::alive;
}

owner_state check_owner(storage::journal& journal, std::string_view owner) {
  return owner_liveness(owner, journal.find_worker(owner), storage::now_ms());
}

worker_leases::worker_leases(storage::journal& journal) : read_at_ms_(storage::now_ms()) {
  for (auto& w : journal.workers()) workers_.emplace(w.id, std::move(w));
}

owner_state worker_leases::check(std::string_view owner) const {
  auto w = workers_.find(std::string(owner));
  return owner_liveness(owner, w == workers_.end() ? std::nullopt : std::optional(w->second), storage::now_ms());
}

std::optional<std::int64_t> worker_leases::expiry(std::string_view owner) const {
  auto w = workers_.find(std::string(owner));
  if (w == workers_.end() || w->second.lease_expires_at_ms <= read_at_ms_) return std::nullopt;
  return w->second.lease_expires_at_ms;
}

bool worker_leases::any_alive() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [&](const auto& w) { return check(w.first) == owner_state::alive; });
}

}  // namespace cairn::engine
