#include "engine/doctor.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include "engine/tools/llm_chat.hpp"
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

}  // namespace

std::vector<runtime::doctor_check> doctor(const std::filesystem::path& db, const std::filesystem::path& config_file) {
  auto checks = runtime::make_bwrap_backend()->check();
  checks.push_back(journal_check(db));
  checks.push_back(llm_check(config_file));
  return checks;
}

}  // namespace cairn::engine
