#include "tests/sim/sim_workspace.hpp"

#include <limits>
#include <unordered_map>

namespace cairn::sim {
namespace {

// Every simulated file has these: a checkpoint tells files apart by their bytes.
constexpr std::uint32_t file_mode = 0644;
constexpr std::int64_t file_mtime_ns = 0;

// engine::found_file, remembered: a simulation hashes the same few bytes
// again and again (a step's take, then what it committed).
const engine::found_entry& found(const std::string& bytes) {
  static std::unordered_map<std::string, engine::found_entry> seen;
  if (seen.size() > 100'000) seen.clear();
  auto it = seen.find(bytes);
  if (it == seen.end()) it = seen.emplace(bytes, engine::found_file(bytes, file_mode, file_mtime_ns)).first;
  return it->second;
}

}  // namespace

engine::workspace_state state_of(const files& f) {
  engine::workspace_state state;
  for (const auto& [path, bytes] : f) state[path] = found(bytes).entry;
  return state;
}

files files_of(const engine::piece_source& pieces, const engine::workspace_state& state) {
  files out;
  for (const auto& [path, entry] : state) {
    std::string& bytes = out[path];
    engine::read_checkpoint_file(pieces, entry, std::numeric_limits<std::uint64_t>::max(),
                                 [&](const char* data, std::size_t n) { bytes.append(data, n); });
  }
  return out;
}

fake_keeper::fake_keeper(files& workspace, const engine::piece_source& pieces, engine::workspace_state state,
                         bool roll_back, std::uint64_t budget_bytes, std::uint64_t spent_bytes)
    : workspace_(workspace), chain_(std::move(state), budget_bytes, spent_bytes) {
  if (!roll_back) {
    // The walk as the attempt begins: what is as the last checkpoint left it is not taken again.
    for (const auto& [path, bytes] : workspace_)
      if (auto it = chain_.state().find(path); it != chain_.state().end() && it->second == found(bytes).entry)
        unchanged_[path] = bytes;
    return;
  }
  auto kept = files_of(pieces, chain_.state());
  for (const auto& [path, bytes] : workspace_) {
    auto it = kept.find(path);
    if (it == kept.end() || it->second != bytes) ++rolled_back_;
  }
  for (const auto& [path, bytes] : kept)
    if (!workspace_.count(path)) ++rolled_back_;
  workspace_ = std::move(kept);
  unchanged_ = workspace_;
}

// What changed since the last take, as inotify would tell it.
std::optional<engine::workspace_checkpoint> fake_keeper::take() {
  std::map<std::string, std::optional<engine::found_entry>> changed;
  for (const auto& [path, bytes] : workspace_)
    if (auto it = unchanged_.find(path); it == unchanged_.end() || it->second != bytes) changed[path] = found(bytes);
  for (const auto& [path, entry] : chain_.state())
    if (!workspace_.count(path)) changed[path] = std::nullopt;
  taken_ = workspace_;
  auto checkpoint = chain_.next(changed);
  unchanged_ = workspace_;
  return checkpoint;
}

}  // namespace cairn::sim
