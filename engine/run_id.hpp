// What a run may be called. A run id names host files under CAIRN_HOME
// (workspaces/ID, images/ID.img, logs/ID.log) and the run's cgroup, so it is
// [A-Za-z0-9][A-Za-z0-9._-]{0,127}, holds no "..", and does not end in a
// suffix cairn gives its own files. A child run is PARENT.SEQ and obeys the
// same rule: a tree whose child ids would pass 128 characters is refused at
// the child that would (give the root a shorter id).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cairn::engine {

inline constexpr std::size_t max_run_id_size = 128;

// Every suffix cairn appends to a name for a file of its own (a workspace's
// image and its staging copies, logs, locks, the journal's SQLite files).
inline constexpr std::array<std::string_view, 9> reserved_run_id_suffixes = {
    ".img", ".new", ".released", ".log", ".lock", ".db", "-wal", "-shm", "-journal"};

// Why `id` cannot name a run ("... is not a valid run id: ...; ids are ..."),
// or nullopt when it can.
std::optional<std::string> run_id_problem(std::string_view id);

}  // namespace cairn::engine
