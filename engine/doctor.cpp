#include "engine/doctor.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/owner.hpp"

#include "engine/tools/llm_chat.hpp"
#include "protocol/messages.hpp"
#include "protocol/version.hpp"
#include "storage/journal.hpp"
#include "storage/postgres/postgres_journal.hpp"
#include "storage/sqlite/sqlite_journal.hpp"

namespace cairn::engine {
namespace {

// One read's round trip and one committed write (a worker row added and
// removed again: nothing is left behind), in ms, the best of a few.
runtime::doctor_check latency_check(const std::filesystem::path& db, const std::string& shown) {
  runtime::doctor_check c;
  c.name = "journal latency";
  using steady = std::chrono::steady_clock;
  const auto ms_since = [](steady::time_point t) {
    return std::chrono::duration<double, std::milli>(steady::now() - t).count();
  };
  try {
    auto j = storage::open_journal(db);
    const std::string probe = "doctor:" + current_owner().str();
    double read = 1e9, write = 1e9;
    for (int i = 0; i < 3; ++i) {
      auto t = steady::now();
      j->find_worker(probe);
      read = std::min(read, ms_since(t));
      const auto now = storage::now_ms();
      t = steady::now();
      j->register_worker({probe, current_owner().hostname, "", now, now, now, 0, 0});
      write = std::min(write, ms_since(t));
      j->remove_worker(probe);
    }
    c.ok = true;
    c.detail = fmt::format("one read {:.2f} ms, one committed write {:.2f} ms", read, write);
  } catch (const storage::storage_error& e) {
    c.detail = e.what();
    c.fix = fmt::format("{} can be read but not written: see the message above", shown);
  }
  return c;
}

// The journal: where it is, which backend, its schema against this cairn's,
// and what one read and one committed write cost. Read-only first: a journal
// of an older schema is reported, not migrated, and nothing is written to one
// from a newer cairn.
std::vector<runtime::doctor_check> journal_checks(const std::filesystem::path& db, const std::string& shown) {
  const bool remote = storage::is_postgres_url(db.string());
  runtime::doctor_check reached;
  reached.name = "journal";
  std::error_code ec;
  if (!remote && !std::filesystem::exists(db, ec)) {
    auto dir = db.parent_path();
    while (!dir.empty() && !std::filesystem::exists(dir, ec)) dir = dir.parent_path();
    reached.ok = access(dir.empty() ? "." : dir.c_str(), W_OK) == 0;
    reached.detail = fmt::format("{} will be created (nothing has run yet)", shown);
    if (!reached.ok) reached.fix = fmt::format("{} is not writable: pass --db PATH or set CAIRN_HOME", dir.string());
    return {reached};
  }
  runtime::doctor_check schema;
  schema.name = "journal schema";
  try {
    auto j = storage::open_journal(db, {.read_only = true});
    reached.ok = true;
    reached.detail = fmt::format("{}: {}, {}", shown, j->backend(), j->server_version());
    schema.ok = true;
    const auto made = j->versions();
    schema.detail = fmt::format("v{}, this cairn's; created by {}, last written by {}", j->schema_version(),
                                made.created_by.empty() ? "(not recorded)" : made.created_by,
                                made.last_written_by.empty() ? "(not recorded)" : made.last_written_by);
  } catch (const storage::storage_error& e) {
    // Told apart by code where storage has one; an older schema is the
    // read-only open's errc::io naming it (journal.hpp's open).
    if (e.code() == storage::errc::schema_too_new) {
      reached.ok = true;
      reached.detail = shown;
      schema.detail = e.what();
      schema.fix = "upgrade cairn on this machine (every worker on the journal needs the newer cairn)";
      return {reached, schema};
    }
    if (e.code() == storage::errc::not_found) {
      reached.ok = true;
      reached.detail = fmt::format("{}: empty; the first writer creates the schema", shown);
      return {reached};
    }
    if (e.code() == storage::errc::io && std::string_view(e.what()).find("older than this cairn") != std::string_view::npos) {
      reached.ok = true;
      reached.detail = shown;
      schema.ok = true;
      schema.detail = fmt::format("{}; it will be migrated by the next writer", e.what());
      return {reached, schema};
    }
    reached.detail = e.what();
    reached.fix = remote ? fmt::format("check that the PostgreSQL server named in {} runs, is reachable from this "
                                       "machine (host and port), and accepts this user and database (pg_hba.conf, "
                                       "the password); or pass another --db / CAIRN_DB",
                                       shown)
                         : "see the message above; pass --db PATH to use another journal";
    return {reached};
  }
  return {reached, schema, latency_check(db, shown)};
}

// Informational: a run without llm.chat needs no endpoint. Never shows the key.
runtime::doctor_check llm_check(const std::filesystem::path& config_file) {
  runtime::doctor_check c;
  c.name = "llm endpoint";
  c.ok = true;
  try {
    auto endpoint = llm_endpoint_from_host(config_file);
    if (!endpoint)
      c.detail = "not configured: llm.chat calls fail until CAIRN_LLM_BASE_URL is set (or \"llm\" in " +
                 config_file.string() + ")";
    else
      c.detail = fmt::format("{} (model {}, API key {})", endpoint->base_url,
                             endpoint->model.empty() ? "chosen per call" : endpoint->model,
                             endpoint->api_key.empty() ? "not set" : "set, kept on the host");
  } catch (const std::exception& e) {
    c.ok = false;
    c.detail = e.what();
    c.fix = "fix or remove " + config_file.string();
  }
  return c;
}

// Bytes on disk (allocated) and apparent of what `folder` holds, never
// through a link or into another filesystem (a live run's mounted image is
// counted as its image file). Bounded: past `max_entries` it says so.
struct disk_use {
  std::uint64_t allocated = 0, apparent = 0, entries = 0;
  bool partial = false;
};
disk_use disk_use_of(const std::filesystem::path& folder, std::uint64_t max_entries) {
  disk_use use;
  struct stat top {};
  if (::lstat(folder.c_str(), &top) < 0 || !S_ISDIR(top.st_mode)) return use;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(folder, std::filesystem::directory_options::skip_permission_denied,
                                                   ec);
  for (; !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (++use.entries > max_entries) {
      use.partial = true;
      break;
    }
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) < 0) continue;
    if (st.st_dev != top.st_dev) {
      it.disable_recursion_pending();
      continue;
    }
    use.allocated += static_cast<std::uint64_t>(st.st_blocks) * 512;
    if (S_ISREG(st.st_mode)) use.apparent += static_cast<std::uint64_t>(st.st_size);
  }
  return use;
}

std::string mib(std::uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// Informational: what the journal and the home take on disk, by folder
// (quota images are sparse: their apparent size is what they may grow to).
runtime::doctor_check space_check(const std::filesystem::path& db, const std::filesystem::path& home) {
  runtime::doctor_check c;
  c.name = "space";
  c.ok = true;
  std::vector<std::string> parts;
  try {
    std::error_code ec;
    if (storage::is_postgres_url(db.string()) || std::filesystem::exists(db, ec)) {
      const auto space = storage::open_journal(db, {.read_only = true})->space();
      parts.push_back(fmt::format("journal {} ({} free for reuse)", mib(space.bytes), mib(space.free_bytes)));
    }
  } catch (const storage::storage_error&) {
    // The journal's own check says why.
  }
  constexpr std::uint64_t max_entries = 1'000'000;
  disk_use total;
  for (const char* name : {"workspaces", "images", "logs", "agents"}) {
    const auto use = disk_use_of(home / name, max_entries);
    total.allocated += use.allocated;
    total.partial = total.partial || use.partial;
    if (use.entries == 0) continue;
    parts.push_back(use.apparent > 2 * use.allocated + (1 << 20)
                        ? fmt::format("{} {} on disk ({} apparent, sparse)", name, mib(use.allocated), mib(use.apparent))
                        : fmt::format("{} {}", name, mib(use.allocated)));
  }
  const auto whole = disk_use_of(home, max_entries);
  if (whole.entries == 0 && parts.empty()) {
    c.detail = fmt::format("{}: nothing stored yet", home.string());
    return c;
  }
  c.detail = fmt::format("{} {}{} on disk{}{}", home.string(), whole.partial ? "at least " : "", mib(whole.allocated),
                         parts.empty() ? "" : ": ", fmt::join(parts, ", "));
  if (total.partial) c.detail += fmt::format(" (over {} entries: counted in part)", max_entries);
  return c;
}

}  // namespace

std::vector<runtime::doctor_check> doctor(const std::filesystem::path& db, const std::string& shown_db,
                                          const std::filesystem::path& config_file) {
  std::vector<runtime::doctor_check> checks = {
      {"version", true,
       fmt::format("cairn {} (protocol v{}, journal schema v{} on SQLite, v{} on PostgreSQL)", protocol::cairn_version(),
                   protocol::version, storage::sqlite::schema_version(),
                   storage::postgres::schema_version()),
       ""}};
  for (auto& c : runtime::make_bwrap_backend()->check()) checks.push_back(std::move(c));
  for (auto& c : journal_checks(db, shown_db)) checks.push_back(std::move(c));
  checks.push_back(llm_check(config_file));
  checks.push_back(space_check(db, config_file.parent_path()));
  return checks;
}

}  // namespace cairn::engine
