#include "cli/home_trust.hpp"

#include "engine/run_paths.hpp"
#include "storage/journal.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>

namespace cairn::cli {
namespace {

namespace fs = std::filesystem;

std::string user_name(uid_t uid) {
  if (const passwd* pw = ::getpwuid(uid)) return fmt::format("uid {} ({})", uid, pw->pw_name);
  return fmt::format("uid {}", uid);
}

// nullopt when nothing is at `path`.
std::optional<struct stat> lstat_of(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return st;
  if (errno == ENOENT) return std::nullopt;
  throw trust_error(fmt::format("cannot inspect {}: {}", path.string(), std::strerror(errno)));
}

// `what` names the path for the user ("CAIRN_HOME", "the journal").
void check_owned(const fs::path& path, const std::string& what, bool folder) {
  auto st = lstat_of(path);
  if (!st) return;
  if (S_ISLNK(st->st_mode))
    throw trust_error(fmt::format("{} {} is a symbolic link; cairn does not follow links in its own folders: "
                                  "remove it, or point CAIRN_HOME / --db at the real path",
                                  what, path.string()));
  if (folder ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode))
    throw trust_error(fmt::format("{} {} is not a {}", what, path.string(), folder ? "folder" : "regular file"));
  const uid_t me = ::geteuid();
  if (st->st_uid != me)
    throw trust_error(fmt::format("{} {} belongs to {}, not to you ({}): cairn would act on what that user put "
                                  "there. Use a folder of your own (e.g. a fresh CAIRN_HOME), or, if it is "
                                  "yours, `chown -R {} {}`",
                                  what, path.string(), user_name(st->st_uid), user_name(me), me, path.string()));
  if (st->st_mode & (S_IWGRP | S_IWOTH))
    throw trust_error(fmt::format("{} {} may be written by {} (mode {:04o}): another user could change what "
                                  "cairn runs; `chmod go-w {}`",
                                  what, path.string(), st->st_mode & S_IWOTH ? "every user" : "its group",
                                  st->st_mode & 07777, path.string()));
}

}  // namespace

std::vector<std::string> secure_home(const paths& p) {
  const bool root = ::geteuid() == 0;
  std::error_code ec;
  fs::create_directories(p.home.parent_path(), ec);  // with the user's umask, as the folders above always were
  if (::mkdir(p.home.c_str(), 0700) == 0 && root) ::chmod(p.home.c_str(), 0711);
  check_owned(p.home, "CAIRN_HOME", true);
  // Root acts on the home's folders by path: no other user may swap one.
  try {
    engine::check_unswappable(p.home, "CAIRN_HOME");
  } catch (const engine::engine_error& e) {
    throw trust_error(e.what());
  }
  for (const char* folder : {"workspaces", "images", "logs"}) check_owned(p.home / folder, "CAIRN_HOME", true);
  // A PostgreSQL journal is no file here: the server guards it.
  if (!storage::is_postgres_url(p.db.string())) {
    if (p.db.parent_path() != p.home) check_owned(p.db.parent_path(), "the journal's folder", true);
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) check_owned(p.db.string() + suffix, "the journal", false);
  }
  std::vector<std::string> warnings;
  const fs::path config = p.home / "config.json";
  check_owned(config, "the host config", false);
  if (auto st = lstat_of(config); st && (st->st_mode & 077))
    warnings.push_back(fmt::format("{} (it holds API keys) may be read by {} (mode {:04o}): `chmod 600 {}`",
                                   config.string(), st->st_mode & 007 ? "every user" : "its group",
                                   st->st_mode & 07777, config.string()));
  return warnings;
}

}  // namespace cairn::cli
