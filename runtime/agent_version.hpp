// An agent's version: a content hash of what its sandbox runs, and a copy
// of it kept by that hash, so that a run that waits for days resumes on the
// code it began with whatever was rebuilt at its path meanwhile.
//
// What the hash covers. A compiled agent: the program file. A script agent
// (one that starts with "#!", run from its folder, app_folder.hpp): every
// regular file, folder and symbolic link below the folder, by its path, its
// content and its executable bit (a link by the text of its target: no link
// is ever followed, here or in the copy), except
//   - what the sandbox hides: every dot-entry at the folder's top (./.cairn,
//     .env, .git; a virtualenv .venv is shown, and covered) and the private
//     paths (CAIRN_HOME, the journal) wherever they lie;
//   - caches, at any depth: __pycache__, .git, .cache, .pytest_cache,
//     .mypy_cache (node_modules is the agent's dependencies, and covered);
//   - sockets, fifos and devices.
// A folder past its bounds (more entries or bytes than agent_bounds) is not
// versioned whole: the version then covers the program alone, and no copy
// of it is kept.
//
// The copy is STORE/HEX (STORE is CAIRN_HOME/agents): the folder as covered
// (or the program alone), files without write permission for anyone, made
// under a temporary name and renamed into place, so no process ever sees one
// half made; one copy per content, however many runs use it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace cairn::runtime {

struct agent_bounds {
  std::uint64_t max_files = 10'000;      // entries: files, folders and links
  std::uint64_t max_bytes = 256ull << 20;  // of every file's content
};

struct agent_version {
  std::filesystem::path program;  // canonical
  std::string id;                 // "sha256:HEX" of what is covered; names its copy
  std::string program_sha256;     // HEX of the program file's bytes
  bool script = false;            // `id` covers the program's folder
  std::uint64_t files = 0, bytes = 0;  // what `id` covers
  std::string partial;  // why `id` covers the program alone though it is a script ("" when it does not)
  bool operator==(const agent_version&) const = default;
};

// Identifies the agent at `program` (its path; links in the path itself are
// resolved, as check_program does). `private_paths` as sandbox_spec's.
// Throws sandbox_error(bad_spec) when the program is missing or cannot be
// read, or its folder cannot be listed or is one the sandbox refuses to
// show (view_of_app_folder: a home, a folder every user may write, ...).
agent_version identify_agent(const std::filesystem::path& program,
                             const std::vector<std::filesystem::path>& private_paths, const agent_bounds& bounds = {});

// The kept program of version `id`, run as `program_name`, in `store`, if
// a copy of it is there (a folder, never a link).
std::optional<std::filesystem::path> find_kept_agent(const std::filesystem::path& store, const std::string& id,
                                                     const std::string& program_name);

// Keeps a copy of `v` (identify_agent's, just now) in `store`, made 0700
// (0711 under root, whose sandbox uid must pass) when missing. Returns the
// kept program, or why none is kept: `v` is partial, under root a script
// lies where other users may not enter (its sandbox's uid could not reach
// it there, and the copy must not open it), or what is at the path now is
// no longer `v` (it changed while it was copied). Throws
// sandbox_error(bad_spec) when `store` cannot be written.
std::variant<std::filesystem::path, std::string> keep_agent(const agent_version& v, const std::filesystem::path& store,
                                                            const std::vector<std::filesystem::path>& private_paths,
                                                            const agent_bounds& bounds = {});

}  // namespace cairn::runtime
