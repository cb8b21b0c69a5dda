#include "runtime/own_records.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t max_subject_bytes = 4096;

// Whether `st` is a folder of this user that no one else may enter.
bool ours_alone(const struct stat& st) {
  return S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0;
}

// Why `name` in `parent` is not a folder of this user's alone.
std::string why_not_ours(int parent, const std::string& name, const fs::path& path) {
  struct stat st {};
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0)
    return fmt::format("{}: {}", path.string(), std::strerror(errno));
  if (S_ISLNK(st.st_mode)) return fmt::format("{} is a symbolic link", path.string());
  if (!S_ISDIR(st.st_mode)) return fmt::format("{} is not a folder", path.string());
  if (st.st_uid != ::geteuid())
    return fmt::format("{} belongs to uid {}, not to this user (uid {})", path.string(), st.st_uid, ::geteuid());
  return fmt::format("{} may be entered by others (mode {:04o})", path.string(), st.st_mode & 07777);
}

struct records_folder {
  fs::path path;
  unique_fd fd;
};

// The folders that hold this user's records, in the order of the header's
// list: every one (to read), or only the first that can take new ones (to
// write, made if missing).
struct records_search {
  bool writing;
  std::vector<records_folder> found;
  std::vector<std::string> passed_over;

  bool done() const { return writing && !found.empty(); }

  // `name` in the open folder `parent` (reached as `parent_path`), if it is
  // this user's alone; made 0700 first when writing.
  void add(int parent, const fs::path& parent_path, const std::string& name) {
    const fs::path path = parent_path / name;
    if (writing && ::mkdirat(parent, name.c_str(), 0700) < 0 && errno != EEXIST) {
      passed_over.push_back(fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
      return;
    }
    unique_fd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    const int open_error = fd ? 0 : errno;
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) < 0 || !ours_alone(st)) {
      if (open_error != ENOENT || writing) passed_over.push_back(why_not_ours(parent, name, path));
      return;
    }
    for (const auto& f : found)
      if (struct stat seen {}; ::fstat(f.fd.get(), &seen) == 0 && seen.st_dev == st.st_dev && seen.st_ino == st.st_ino)
        return;  // $XDG_RUNTIME_DIR is /run/user/UID
    found.push_back({path, std::move(fd)});
  }

  // cairn-records in the user's runtime folder `dir`, if that is the user's alone.
  void add_in_runtime_folder(const fs::path& dir, const std::string& what) {
    if (done() || !dir.is_absolute()) return;
    unique_fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!fd && errno == ENOENT) return;
    if (!fd || ::fstat(fd.get(), &st) < 0 || !ours_alone(st)) {
      passed_over.push_back(fmt::format("{}: {}", what, why_not_ours(AT_FDCWD, dir.string(), dir)));
      return;
    }
    add(fd.get(), dir, "cairn-records");
  }

  // /tmp/cairn-records-UID, else the user's /tmp/cairn-records-UID-XXXXXX,
  // made when writing and there is none.
  void add_in_tmp() {
    if (done()) return;
    const std::string name = fmt::format("cairn-records-{}", ::geteuid());
    unique_fd tmp(::open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!tmp) {
      passed_over.push_back(fmt::format("/tmp: {}", std::strerror(errno)));
      return;
    }
    add(tmp.get(), "/tmp", name);
    if (done()) return;
    std::vector<std::string> others;  // found by name, kept only when the user's alone
    if (int listing_fd = ::openat(tmp.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); listing_fd >= 0) {
      if (DIR* listing = ::fdopendir(listing_fd)) {
        while (dirent* entry = ::readdir(listing))
          if (std::string_view(entry->d_name).starts_with(name + "-")) others.emplace_back(entry->d_name);
        ::closedir(listing);
      } else {
        ::close(listing_fd);
      }
    }
    std::sort(others.begin(), others.end());
    const std::size_t passed = passed_over.size();
    for (const auto& other : others)
      if (!done()) add(tmp.get(), "/tmp", other);
    passed_over.resize(passed);  // another user's names are theirs: not ours to report
    if (done() || !writing) return;
    std::string made = "/tmp/" + name + "-XXXXXX";
    if (!::mkdtemp(made.data())) {
      passed_over.push_back(fmt::format("cannot create {}: {}", made, std::strerror(errno)));
      return;
    }
    add(tmp.get(), "/tmp", fs::path(made).filename());
  }
};

records_search search_records(bool writing) {
  records_search search{writing, {}, {}};
  if (::geteuid() == 0) {
    unique_fd run(::open("/run", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (run) search.add(run.get(), "/run", "cairn-records");
    else search.passed_over.push_back(fmt::format("/run: {}", std::strerror(errno)));
    return search;
  }
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg)
    search.add_in_runtime_folder(xdg, fmt::format("XDG_RUNTIME_DIR={}", xdg));
  search.add_in_runtime_folder(fmt::format("/run/user/{}", ::geteuid()), "the user's runtime folder");
  search.add_in_tmp();
  return search;
}

// The folder of a record found or written earlier, if it is still the user's alone.
unique_fd reopen_folder(const fs::path& folder) {
  unique_fd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) < 0 || !ours_alone(st)) return {};
  return fd;
}

std::string random_token() {
  unsigned char bytes[16];
  for (std::size_t got = 0; got < sizeof bytes;) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  std::string token;
  for (unsigned char b : bytes) token += fmt::format("{:02x}", b);
  return token;
}

}  // namespace

own_record::own_record(const std::string& kind, const std::string& subject) : token_(random_token()) {
  records_search search = search_records(true);
  if (search.found.empty()) {
    std::string why;
    for (const auto& reason : search.passed_over) why += (why.empty() ? "" : "; ") + reason;
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("cairn has no folder for its records that only uid {} may enter ({}); set "
                                    "XDG_RUNTIME_DIR to a folder of yours with mode 0700 (mkdir -m 0700 DIR)",
                                    ::geteuid(), why));
  }
  const records_folder& folder = search.found.front();
  const std::string name = kind + "-" + token_;
  unique_fd fd(::openat(folder.fd.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd || ::write(fd.get(), subject.data(), subject.size()) != static_cast<ssize_t>(subject.size())) {
    int error = errno;
    ::unlinkat(folder.fd.get(), name.c_str(), 0);
    errno = error;
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("writing the record {}: {}", (folder.path / name).string(), std::strerror(errno)));
  }
  file_ = folder.path / name;
}

own_record::~own_record() {
  if (unique_fd folder = reopen_folder(file_.parent_path())) ::unlinkat(folder.get(), file_.filename().c_str(), 0);
}

std::vector<found_record> own_records(const std::string& kind) {
  std::vector<found_record> found;
  const std::string prefix = kind + "-";
  for (const auto& folder : search_records(false).found) {
    int listing_fd = ::dup(folder.fd.get());
    DIR* listing = listing_fd < 0 ? nullptr : ::fdopendir(listing_fd);
    if (!listing) {
      if (listing_fd >= 0) ::close(listing_fd);
      continue;
    }
    std::unique_ptr<DIR, int (*)(DIR*)> guard(listing, ::closedir);
    while (dirent* entry = ::readdir(listing)) {
      std::string name = entry->d_name;
      if (!name.starts_with(prefix)) continue;
      unique_fd fd(::openat(folder.fd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd) continue;
      std::string subject(max_subject_bytes, '\0');
      ssize_t n = ::read(fd.get(), subject.data(), subject.size());
      subject.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      found.push_back({folder.path / name, name.substr(prefix.size()), std::move(subject)});
    }
  }
  return found;
}

void forget_record(const found_record& record) {
  if (unique_fd folder = reopen_folder(record.file.parent_path()))
    ::unlinkat(folder.get(), record.file.filename().c_str(), 0);
}

records_place find_records_place() {
  records_search search = search_records(true);
  records_place place;
  if (!search.found.empty()) place.folder = search.found.front().path;
  place.passed_over = std::move(search.passed_over);
  return place;
}

}  // namespace cairn::runtime
