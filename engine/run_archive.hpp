// The archive `cairn export` writes and `cairn import` reads: one run's
// journal and the workspace pieces its checkpoints name, to move it between
// machines or backends. A tar archive (POSIX pax), zstd-compressed, whose
// entries are, in this order:
//
//   manifest.json      {"format": "cairn-run-export", "version": 1,
//                       "cairn": "0.1.0", "backend": "sqlite", "run": ID,
//                       "exported_at_ms": T, "counts": {"steps", "events",
//                       "signals", "pieces"}, "entries": [{"name", "size",
//                       "sha256": HEX}, ...]}: every other entry, in order
//   run.json           the run's row
//   steps.jsonl        one step a line, by seq
//   events.jsonl       one event a line, oldest first
//   signals.jsonl      one signal a line, oldest first
//   run_state.json     the ledger's kept state (null when the run has none)
//   pieces/sha256-HEX  a workspace piece as the journal stores it ("z" and a
//                      zstd frame, or "r" and its bytes)
//
// Nothing else is read: any other name, type (link, device, fifo, folder)
// or size than the manifest's is refused. libarchive stays in this file's
// .cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/unique_fd.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

inline constexpr std::string_view archive_format = "cairn-run-export";
inline constexpr int archive_version = 1;
// What an archive may hold, uncompressed, in all: larger is refused before
// anything is read past its manifest (a decompression bomb).
inline constexpr std::uint64_t max_archive_bytes = std::uint64_t{4} << 30;

// What write_run_archive wrote.
struct export_summary {
  std::uint64_t steps = 0, events = 0, signals = 0, pieces = 0;
  std::uint64_t bytes = 0;  // uncompressed, all entries
};

// Writes run `run_id` of `journal` to `fd` as the archive. A run still
// running is exported as its journal durably holds it: the steps there when
// the export began, the events up to them. Pieces are read and written one
// at a time. Throws engine_error(not_found) for no such run.
export_summary write_run_archive(storage::journal& journal, const std::string& run_id, int fd);

// Pieces read from an archive, kept in an unnamed temporary file until the
// import writes them (memory holds one at a time).
class piece_spool {
 public:
  // The file is made in `folder` (O_TMPFILE: nothing is left behind).
  explicit piece_spool(const std::filesystem::path& folder);
  void add(const storage::blob& b);
  std::optional<storage::blob> find(const std::string& digest) const;
  bool contains(const std::string& digest) const { return places_.contains(digest); }
  std::vector<std::string> digests() const;

 private:
  struct place {
    std::uint64_t offset = 0, size = 0, stored = 0;
  };
  runtime::unique_fd fd_;
  std::uint64_t end_ = 0;
  std::map<std::string, place> places_;
};

// A run as an archive holds it, checked.
struct archived_run {
  json manifest;
  storage::run_record run;
  std::vector<storage::step_record> steps;
  std::vector<storage::event_record> events;
  std::vector<storage::signal_record> signals;
  std::optional<json> state;
};

// Reads the archive from `fd` and checks all of it: its format and version,
// each entry's name, type, size and SHA-256 against the manifest, every
// piece against its digest, every row. Throws engine_error(bad_request)
// with a one-line message saying what is wrong; nothing is written but the
// spool.
archived_run read_run_archive(int fd, piece_spool& spool);

}  // namespace cairn::engine
