#include "engine/doctor.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include "storage/journal.hpp"

namespace cairn::engine {
namespace {

runtime::doctor_check journal_check(const std::filesystem::path& db) {
  runtime::doctor_check c;
  c.name = "journal writable";
  std::error_code ec;
  if (std::filesystem::exists(db, ec)) {
    try {
      storage::journal j(db);
      c.ok = true;
      c.detail = fmt::format("{} (schema v{}, {} runs)", db.string(), storage::journal::schema_version(),
                             j.list_runs().size());
    } catch (const storage::storage_error& e) {
      c.detail = e.what();
      c.fix = "see the message above; pass --db PATH to use another journal";
    }
    return c;
  }
  auto dir = db.parent_path();
  while (!dir.empty() && !std::filesystem::exists(dir, ec)) dir = dir.parent_path();
  c.ok = access(dir.empty() ? "." : dir.c_str(), W_OK) == 0;
  c.detail = fmt::format("{} will be created (nothing has run yet)", db.string());
  if (!c.ok) c.fix = fmt::format("{} is not writable: pass --db PATH or set CAIRN_HOME", dir.string());
  return c;
}

}  // namespace

std::vector<runtime::doctor_check> doctor(const std::filesystem::path& db) {
  auto checks = runtime::make_bwrap_backend()->check();
  checks.push_back(journal_check(db));
  return checks;
}

}  // namespace cairn::engine
