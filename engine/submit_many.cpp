// engine::submit_many: a batch of runs (an eval suite, a rollout batch)
// queued in one transaction.
#include <map>

#include <fmt/format.h>

#include "engine/engine.hpp"

namespace cairn::engine {

std::vector<submitted_run> engine::submit_many(std::vector<run_request> requests) {
  std::vector<storage::new_run> runs;
  runs.reserve(requests.size());
  std::map<std::string, std::size_t> place_of;  // a given id, and where it was first given
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto& request = requests[i];
    const auto refuse = [&](const std::string& why) {
      return engine_error(errc::bad_request, fmt::format("run {} of the batch: {}; nothing was submitted", i + 1, why));
    };
    if (!request.workspace.empty())
      throw refuse("a run of a batch cannot be given a workspace: it gets its own, HOME/workspaces/ID");
    if (!request.id.empty()) {
      const auto [first, fresh] = place_of.emplace(request.id, i + 1);
      if (!fresh) throw refuse(fmt::format("run id {} was given to run {} already", request.id, first->second));
    }
    try {
      runs.push_back(new_run_of(std::move(request)));
    } catch (const engine_error& e) {
      throw refuse(e.what());
    }
  }
  return ledger_->create_runs(runs);
}

}  // namespace cairn::engine
