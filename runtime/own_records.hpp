// What cairn made on this machine that a crashed host leaves behind (the
// loop mounts of workspace images, the sandboxes' first processes), written
// down before it is made and crossed out once it is gone, so the sweeps of a
// later host act on cairn's own things only, never on a mount or a process
// that merely looks like one of cairn's.
//
// One small file per record in a folder only its owner may enter: as root
// /run/cairn-records, else /tmp/cairn-records-UID; created 0700 and opened without
// following links, refused when someone else owns it. A record is
// `KIND-TOKEN` (TOKEN: 32 random hex digits) holding its subject as text.
// Internal to runtime/.
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

}  // namespace cairn::runtime
