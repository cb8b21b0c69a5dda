// `cairn doctor`: can this machine run sandboxed agents, and can it write the
// journal? Each failed check carries its fix.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/sandbox.hpp"

namespace cairn::engine {

// `db` is a SQLite file or a PostgreSQL URL, `shown_db` how messages name it
// (a URL without its password); `config_file` is the host config that may
// name the LLM endpoint. The journal checks: it can be reached (backend and
// server version), its schema against this cairn's, and the latency of one
// read and one committed write. Last, what the journal and the home
// (`config_file`'s folder, CAIRN_HOME) take on disk, by folder.
std::vector<runtime::doctor_check> doctor(const std::filesystem::path& db, const std::string& shown_db,
                                          const std::filesystem::path& config_file);

}  // namespace cairn::engine
