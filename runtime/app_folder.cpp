#include "runtime/app_folder.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const fs::path& folder, const std::string& why) {
  throw sandbox_error(sandbox_errc::bad_spec,
                      fmt::format("a script agent runs with its folder bound read-only in the sandbox, and {} {}: "
                                  "the agent could read what it holds; keep the script and its modules in a folder "
                                  "of their own (mkdir agent && mv SCRIPT MODULES agent/)",
                                  folder.string(), why));
}

fs::path canonical_or_empty(const fs::path& p) {
  std::error_code ec;
  auto c = fs::weakly_canonical(p, ec);
  return ec ? fs::path() : c.lexically_normal();
}

// Whether `inner` is `outer` or lies below it (both canonical).
bool within(const fs::path& inner, const fs::path& outer) {
  if (inner.empty() || outer.empty()) return false;
  auto rel = inner.lexically_relative(outer);
  return !rel.empty() && *rel.begin() != "..";
}

std::vector<fs::path> home_folders() {
  std::vector<fs::path> homes;
  if (const char* home = std::getenv("HOME"); home && *home) homes.push_back(canonical_or_empty(home));
  if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_dir && *pw->pw_dir)
    homes.push_back(canonical_or_empty(pw->pw_dir));
  return homes;
}

// A Python virtualenv: a folder of the interpreter's files, no secrets.
bool is_virtualenv(int dir_fd, const char* name) {
  struct stat st {};
  return std::string(name) == ".venv" && ::fstatat(dir_fd, (std::string(name) + "/pyvenv.cfg").c_str(), &st,
                                                   AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISREG(st.st_mode);
}

void hide(app_view& view, const fs::path& path, mode_t mode) {
  // A link is resolved inside the sandbox, where nothing of the host's lies
  // beyond the bind: it is left as it is.
  if (S_ISDIR(mode)) view.hidden_folders.push_back(path);
  else if (!S_ISLNK(mode)) view.hidden_files.push_back(path);
}

}  // namespace

app_view view_of_app_folder(const fs::path& given, const std::vector<fs::path>& private_paths) {
  app_view view;
  view.folder = canonical_or_empty(given);
  if (view.folder.empty() || view.folder == view.folder.root_path()) refuse(given, "is the root folder");
  for (const auto& home : home_folders())
    if (within(home, view.folder))
      refuse(view.folder, home == view.folder ? "is a home folder (with its ~/.ssh and every dot-file)"
                                              : "holds the home folder " + home.string());
  unique_fd dir(::open(view.folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!dir || ::fstat(dir.get(), &st) < 0)
    throw sandbox_error(sandbox_errc::bad_spec, fmt::format("script agent folder {}: {}", view.folder.string(),
                                                            std::strerror(errno)));
  if (st.st_mode & S_IWOTH) refuse(view.folder, "may be written by every user (a shared folder such as /tmp)");
  for (const auto& given_private : private_paths) {
    const fs::path p = canonical_or_empty(given_private);
    if (p.empty()) continue;
    if (within(view.folder, p)) refuse(view.folder, "lies inside " + p.string() + ", where cairn keeps its own files");
    if (!within(p, view.folder)) continue;
    // A journal goes with its WAL and its locks.
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      const fs::path q = fs::path(p.string() + suffix);
      struct stat qs {};
      if (::lstat(q.c_str(), &qs) == 0) hide(view, q, qs.st_mode);
    }
  }
  // Every dot-entry at the top: ./.cairn (the default CAIRN_HOME), .env,
  // .git, .ssh, .aws, ... An agent's own modules never need one.
  DIR* listing = ::fdopendir(::dup(dir.get()));
  if (!listing)
    throw sandbox_error(sandbox_errc::bad_spec, fmt::format("listing script agent folder {}: {}", view.folder.string(),
                                                            std::strerror(errno)));
  while (const dirent* e = ::readdir(listing)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] != '.' || name == "." || name == ".." || is_virtualenv(dir.get(), e->d_name)) continue;
    struct stat es {};
    if (::fstatat(dir.get(), e->d_name, &es, AT_SYMLINK_NOFOLLOW) == 0) hide(view, view.folder / name, es.st_mode);
  }
  ::closedir(listing);
  // The same path may be hidden twice (./.cairn is a dot-entry and CAIRN_HOME).
  for (auto* list : {&view.hidden_folders, &view.hidden_files}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
  }
  return view;
}

std::vector<std::string> app_view_options(const app_view& view, const fs::path& inside) {
  std::vector<std::string> options;
  // Parents before what lies below them (sorted), so no cover hides another.
  std::vector<fs::path> covering;
  auto covered = [&](const fs::path& p) {
    for (const auto& folder : covering)
      if (within(p, folder)) return true;
    return false;
  };
  for (const auto& folder : view.hidden_folders) {
    if (covered(folder)) continue;
    covering.push_back(folder);
    const std::string at = (inside / folder.lexically_relative(view.folder)).string();
    options.insert(options.end(), {"--perms", "0555", "--tmpfs", at, "--remount-ro", at});
  }
  for (const auto& file : view.hidden_files) {
    if (!covered(file))
      options.insert(options.end(), {"--ro-bind", "/dev/null", (inside / file.lexically_relative(view.folder)).string()});
  }
  return options;
}

}  // namespace cairn::runtime
