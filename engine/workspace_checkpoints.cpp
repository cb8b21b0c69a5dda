#include "engine/workspace_checkpoints.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "engine/engine.hpp"

namespace cairn::engine {
namespace {

storage::storage_error unreadable(std::string_view run_id, const storage::event_record& e, std::string_view why) {
  return storage::storage_error(storage::errc::corrupt, fmt::format("the workspace checkpoint of step {} of run {} "
                                                                    "cannot be read: {}",
                                                                    e.seq.value_or(0), run_id, why));
}

checkpoint_entry entry_of(const json& j) {
  checkpoint_entry e;
  const std::string t = j.at("t").get<std::string>();
  if (t.size() != 1 || (t[0] != 'f' && t[0] != 'd' && t[0] != 'l')) throw std::invalid_argument("an unknown type");
  e.type = t[0];
  e.mode = j.value("m", 0u) & 07777u;
  if (e.type == 'f') {
    e.size = j.at("s").get<std::uint64_t>();
    e.mtime_ns = j.value("mt", std::int64_t{0});
    e.pieces = j.at("p").get<std::vector<std::string>>();
  } else if (e.type == 'l') {
    e.target = j.at("to").get<std::string>();
  }
  return e;
}

// Removes `path` and everything under it.
void erase_tree(workspace_state& state, const std::string& path) {
  state.erase(path);
  const std::string prefix = path + "/";
  for (auto it = state.lower_bound(prefix); it != state.end() && it->first.starts_with(prefix);) it = state.erase(it);
}

}  // namespace

void apply_checkpoint(workspace_state& state, const json& data) {
  for (const auto& path : data.value("removed", json::array())) erase_tree(state, path.get<std::string>());
  for (const auto& [path, entry] : data.value("files", json::object()).items()) {
    auto e = entry_of(entry);
    if (e.type != 'd') erase_tree(state, path);  // a folder replaced by a file
    state[path] = std::move(e);
  }
}

workspace_state checkpoint_state(storage::journal& journal, std::string_view run_id, std::optional<std::uint64_t> seq) {
  workspace_state state;
  for (const auto& e : journal.events(run_id)) {
    if (e.kind != checkpoint_event || !e.seq) continue;
    if (seq && *e.seq > *seq) continue;
    try {
      apply_checkpoint(state, e.data);
    } catch (const std::exception& ex) {
      throw unreadable(run_id, e, ex.what());
    }
  }
  return state;
}

bool has_checkpoint(storage::journal& journal, std::string_view run_id, std::uint64_t seq) {
  for (const auto& e : journal.events(run_id))
    if (e.kind == checkpoint_event && e.seq && *e.seq <= seq) return true;
  return false;
}

void materialize(storage::journal&, const workspace_state&, const std::filesystem::path&) {
  throw std::logic_error("workspace checkpoints are being built");
}

void fork_workspace(storage::journal&, std::string_view, std::uint64_t, std::string_view, const std::filesystem::path&) {
  throw std::logic_error("workspace checkpoints are being built");
}

}  // namespace cairn::engine
