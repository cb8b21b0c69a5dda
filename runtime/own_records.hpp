// What cairn made on this machine that a crashed host leaves behind (the
// loop mounts of workspace images, the sandboxes' first processes), written
// down before it is made and crossed out once it is gone, so the sweeps of a
// later host act on cairn's own things only, never on a mount or a process
// that merely looks like one of cairn's.
//
// One small file per record in a folder of this user (the effective uid)
// that no one else may enter: mode 0700, opened without following a link,
// never one another user made first. As root /run/cairn-records; else
// cairn-records in the user's runtime folder ($XDG_RUNTIME_DIR, then
// /run/user/UID) when that is a folder of the user's alone; else in /tmp,
// where another user can make any name first: /tmp/cairn-records-UID when
// it is the user's, else a folder of the user's named
// /tmp/cairn-records-UID-XXXXXX (made by mkdtemp, found again by its name,
// owner and mode). Records are written to the first of these that can hold
// them and read from all of them, so that every process of one user finds
// them whatever its environment. A record is `KIND-TOKEN` (TOKEN: 32 random
// hex digits) holding its subject as text. Internal to runtime/.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cairn::runtime {

// Written on construction, removed on destruction.
class own_record {
 public:
  // Throws sandbox_error(spawn_failed) when the record cannot be written.
  own_record(const std::string& kind, const std::string& subject);
  ~own_record();
  own_record(const own_record&) = delete;
  own_record& operator=(const own_record&) = delete;

  const std::string& token() const { return token_; }

 private:
  std::filesystem::path file_;
  std::string token_;
};

struct found_record {
  std::filesystem::path file;
  std::string token;
  std::string subject;
};
// The records of `kind` now present.
std::vector<found_record> own_records(const std::string& kind);
void forget_record(const found_record& record);

// Where new records go, and the places passed over on the way with why
// ("/tmp/cairn-records-1000 belongs to uid 1001"), for `cairn doctor`.
// No folder when none can hold them: `passed_over` then says why.
struct records_place {
  std::optional<std::filesystem::path> folder;
  std::vector<std::string> passed_over;
};
records_place find_records_place();

}  // namespace cairn::runtime
