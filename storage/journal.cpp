#include "storage/journal.hpp"

#include <atomic>
#include <chrono>

#include "storage/postgres/postgres_journal.hpp"
#include "storage/sqlite/sqlite_journal.hpp"

namespace cairn::storage {

std::string_view to_string(run_status s) {
  switch (s) {
    case run_status::pending: return "pending";
    case run_status::running: return "running";
    case run_status::waiting: return "waiting";
    case run_status::completed: return "completed";
    case run_status::failed: return "failed";
    case run_status::cancelled: return "cancelled";
    case run_status::in_doubt: return "in_doubt";
  }
  return "unknown";
}

std::optional<run_status> parse_run_status(std::string_view s) {
  using enum run_status;
  for (auto st : {pending, running, waiting, completed, failed, cancelled, in_doubt})
    if (to_string(st) == s) return st;
  return std::nullopt;
}

bool is_finished(run_status s) {
  return s == run_status::completed || s == run_status::failed || s == run_status::cancelled;
}

namespace {
std::atomic<std::int64_t (*)()> test_clock{nullptr};
}  // namespace

std::int64_t now_ms() {
  if (auto clock = test_clock.load(std::memory_order_relaxed)) return clock();
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

void set_now_ms_for_testing(std::int64_t (*clock)()) { test_clock.store(clock, std::memory_order_relaxed); }
std::unique_ptr<journal> open_journal(const std::filesystem::path& path, journal_options options) {
  if (is_postgres_url(path.string())) return postgres::open_journal(path, options);
  return sqlite::open_journal(path, options);
}

bool is_postgres_url(std::string_view db) { return db.starts_with("postgresql://") || db.starts_with("postgres://"); }

std::string without_password(const std::string& url) {
  // scheme://[user[:password]@]host...: the credentials end at the last '@' before the path.
  const auto start = url.find("://");
  if (start == std::string::npos) return url;
  const auto authority_end = url.find_first_of("/?#", start + 3);
  const auto at = url.rfind('@', authority_end);
  std::string shown = url;
  if (const auto colon = url.find(':', start + 3); at != std::string::npos && at > start + 3 &&
                                                   colon != std::string::npos && colon < at)
    shown = url.substr(0, colon + 1) + "***" + url.substr(at);
  // libpq also takes it as a parameter: ...?password=SECRET&...
  if (auto param = shown.find("password=", shown.find('?')); shown.find('?') != std::string::npos &&
                                                             param != std::string::npos) {
    param += std::string_view("password=").size();
    shown.replace(param, shown.find('&', param) == std::string::npos ? std::string::npos : shown.find('&', param) - param,
                  "***");
  }
  return shown;
}

}  // namespace cairn::storage
