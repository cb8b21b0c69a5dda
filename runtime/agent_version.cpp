#include "runtime/agent_version.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "runtime/app_folder.hpp"
#include "runtime/host_paths.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

// Deeper than this a folder is past its bounds (each level holds an fd).
constexpr int max_depth = 64;

class sha256 {
 public:
  sha256() : md_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!md_ || EVP_DigestInit_ex(md_.get(), EVP_sha256(), nullptr) != 1) throw std::bad_alloc();
  }
  void update(const void* data, std::size_t n) { EVP_DigestUpdate(md_.get(), data, n); }
  // A field of a manifest entry, ended by a NUL (no path or link holds one).
  void field(std::string_view s) {
    update(s.data(), s.size());
    update("", 1);
  }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(md_.get(), digest, &size);
    std::string out;
    for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", digest[i]);
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md_;
};

[[noreturn]] void unreadable(const fs::path& what, const char* doing) {
  throw sandbox_error(sandbox_errc::bad_spec,
                      fmt::format("agent {}: {} failed: {}", what.string(), doing, std::strerror(errno)));
}

bool is_cache(std::string_view name) {
  static constexpr std::array<std::string_view, 5> caches = {"__pycache__", ".git", ".cache", ".pytest_cache",
                                                             ".mypy_cache"};
  return std::find(caches.begin(), caches.end(), name) != caches.end();
}

// The sandbox shows a dot-entry at the top of a script's folder only when it
// is a virtualenv (app_folder.cpp).
bool shown_at_top(int dir, const std::string& name) {
  if (name[0] != '.') return true;
  struct stat st {};
  return name == ".venv" && ::fstatat(dir, ".venv/pyvenv.cfg", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

// The file's content hashed, and written to `name` in `dest` (when >= 0)
// with `mode` (its read and execute bits). Returns HEX; counts the bytes.
std::string hash_file(int file, const fs::path& where, int dest, const char* name, mode_t mode,
                      std::uint64_t& bytes) {
  unique_fd out;
  if (dest >= 0) {
    out.reset(::openat(dest, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) unreadable(where, "making its copy");
  }
  sha256 h;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) unreadable(where, "reading");
    if (n == 0) break;
    h.update(buffer, static_cast<std::size_t>(n));
    bytes += static_cast<std::uint64_t>(n);
    for (ssize_t off = 0; out && off < n;) {
      const ssize_t w = ::write(out.get(), buffer + off, static_cast<std::size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) unreadable(where, "writing its copy");
      off += w;
    }
  }
  if (out && ::fchmod(out.get(), mode & 0555) < 0) unreadable(where, "setting its copy's mode");
  return h.hex();
}

// The hashes of files this process read, by what stat says of them (as
// git's index does): an engine identifies a run's agent at every start and
// wake-up, and a 4 MB program took 6 ms to hash, a fifth of a sandbox
// start's CPU. A file whose status changed within the last 2 s is read
// again: a write in the same clock tick would leave its stamps as they were.
class hash_cache {
 public:
  std::optional<std::string> find(const struct stat& st) {
    std::lock_guard lock(mutex_);
    auto it = hashes_.find(key_of(st));
    return it == hashes_.end() ? std::nullopt : std::optional(it->second);
  }
  void add(const struct stat& st, const std::string& hex) {
    if (st.st_ctim.tv_sec + 2 > ::time(nullptr)) return;
    std::lock_guard lock(mutex_);
    if (hashes_.size() >= 100'000) hashes_.clear();
    hashes_[key_of(st)] = hex;
  }

 private:
  using key = std::array<std::int64_t, 7>;
  static key key_of(const struct stat& st) {
    return {static_cast<std::int64_t>(st.st_dev), static_cast<std::int64_t>(st.st_ino), st.st_size,
            st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
  }
  std::mutex mutex_;
  std::map<key, std::string> hashes_;
};

hash_cache& hashes() {
  static hash_cache cache;
  return cache;
}

// hash_file of an open file whose status is `st`: from the cache when it
// was read before and nothing is to be copied.
std::string cached_hash(int file, const struct stat& st, const fs::path& where, int dest, const char* name,
                        std::uint64_t& bytes) {
  if (dest < 0)
    if (auto known = hashes().find(st)) {
      bytes += static_cast<std::uint64_t>(st.st_size);
      return *known;
    }
  const auto hex = hash_file(file, where, dest, name, st.st_mode, bytes);
  hashes().add(st, hex);
  return hex;
}

// A manifest entry of a regular file: its executable bit, size and hash.
void file_entry(sha256& manifest, const std::string& rel, mode_t mode, std::uint64_t size, const std::string& hex) {
  manifest.field(fmt::format("f {} {} {}", (mode & S_IXUSR) ? 1 : 0, size, hex));
  manifest.field(rel);
}

// One walk of a script's folder: the manifest of what it covers, and the
// copy of it when `dest` is given.
struct folder_walk {
  const agent_bounds& bounds;
  std::set<std::pair<dev_t, ino_t>> hidden;  // the private paths
  sha256 manifest;
  std::uint64_t files = 0, bytes = 0;
  std::string past;  // the bound passed ("" while none is)

  void folder(int dir, const fs::path& where, int dest, const std::string& rel, int depth) {
    if (depth > max_depth) {
      past = fmt::format("it is more than {} folders deep", max_depth);
      return;
    }
    std::vector<std::string> names;
    DIR* listing = ::fdopendir(::dup(dir));
    if (!listing) unreadable(where, "listing");
    while (const dirent* e = ::readdir(listing)) {
      std::string name = e->d_name;
      if (name == "." || name == ".." || is_cache(name) || (depth == 0 && !shown_at_top(dir, name))) continue;
      names.push_back(std::move(name));
    }
    ::closedir(listing);
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      if (!past.empty()) return;
      entry(dir, where / name, dest, name.c_str(), rel.empty() ? name : rel + "/" + name, depth);
    }
  }

  void entry(int dir, const fs::path& where, int dest, const char* name, const std::string& rel, int depth) {
    struct stat st {};
    if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) unreadable(where, "stat");
    if (hidden.contains({st.st_dev, st.st_ino})) return;
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) return;
    if (++files > bounds.max_files) {
      past = fmt::format("its folder holds more than {} files", bounds.max_files);
      return;
    }
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX + 1];
      const ssize_t n = ::readlinkat(dir, name, target, sizeof target);
      if (n < 0 || n > PATH_MAX) unreadable(where, "reading the link");
      const std::string_view text(target, static_cast<std::size_t>(n));
      manifest.field("l");
      manifest.field(rel);
      manifest.field(text);
      if (dest >= 0 && ::symlinkat(std::string(text).c_str(), dest, name) < 0) unreadable(where, "copying the link");
    } else if (S_ISDIR(st.st_mode)) {
      unique_fd sub(::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) unreadable(where, "opening");
      unique_fd sub_dest;
      if (dest >= 0) {
        if (::mkdirat(dest, name, 0700) < 0) unreadable(where, "making its copy");
        sub_dest.reset(::openat(dest, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub_dest) unreadable(where, "opening its copy");
      }
      manifest.field("d");
      manifest.field(rel);
      folder(sub.get(), where, sub_dest ? sub_dest.get() : -1, rel, depth + 1);
      // Its owner may still remove it (a copy's files are read-only to all).
      if (sub_dest && ::fchmod(sub_dest.get(), (st.st_mode & 0555) | 0700) < 0)
        unreadable(where, "setting its copy's mode");
    } else {
      if (bytes + static_cast<std::uint64_t>(st.st_size) > bounds.max_bytes) {
        past = fmt::format("its files hold more than {} MiB", bounds.max_bytes >> 20);
        return;
      }
      unique_fd file(::openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      struct stat opened {};
      if (!file || ::fstat(file.get(), &opened) < 0) unreadable(where, "opening");
      std::uint64_t size = 0;
      const auto hex = cached_hash(file.get(), opened, where, dest, name, size);
      bytes += size;
      file_entry(manifest, rel, st.st_mode, size, hex);
    }
  }
};

std::set<std::pair<dev_t, ino_t>> identities(const std::vector<fs::path>& private_paths) {
  std::set<std::pair<dev_t, ino_t>> ids;
  for (const auto& p : private_paths)
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {  // a journal goes with its WAL and locks
      struct stat st {};
      if (::stat((p.string() + suffix).c_str(), &st) == 0) ids.insert({st.st_dev, st.st_ino});
    }
  return ids;
}

// identify_agent, copying what it covers into the folder `dest` (when >= 0).
agent_version scan(const fs::path& program, const std::vector<fs::path>& private_paths, const agent_bounds& bounds,
                   int dest) {
  agent_version v;
  v.program = check_program(program);
  const fs::path folder = script_folder(v.program);
  const std::string name = v.program.filename().string();
  unique_fd file(::open(v.program.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!file || ::fstat(file.get(), &st) < 0) unreadable(v.program, "opening");
  std::uint64_t size = 0;
  // A script's copy is its folder's; the program alone is copied here only for a compiled agent.
  v.program_sha256 = cached_hash(file.get(), st, v.program, folder.empty() ? dest : -1, name.c_str(), size);
  sha256 alone;
  file_entry(alone, name, st.st_mode, size, v.program_sha256);
  v.id = "sha256:" + alone.hex();
  v.files = 1;
  v.bytes = size;
  if (folder.empty()) return v;

  v.script = true;
  // A folder the sandbox would refuse to show (a home, one every user may
  // write, one inside cairn's own) is neither versioned nor copied.
  view_of_app_folder(folder, private_paths);
  unique_fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) unreadable(folder, "opening its folder");
  folder_walk walk{bounds, identities(private_paths), {}, 0, 0, {}};
  walk.folder(dir.get(), folder, dest, "", 0);
  if (!walk.past.empty()) {
    v.partial = walk.past;
    return v;
  }
  v.id = "sha256:" + walk.manifest.hex();
  v.files = walk.files;
  v.bytes = walk.bytes;
  return v;
}

std::string hex_of(const std::string& id) { return id.substr(id.find(':') + 1); }

// The first folder on the way to `path` that other users may not enter.
std::optional<fs::path> closed_to_others(const fs::path& path) {
  for (fs::path p = path.parent_path();; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) < 0 || !(st.st_mode & S_IXOTH)) return p;
    if (p == p.root_path()) return std::nullopt;
  }
}

}  // namespace

agent_version identify_agent(const fs::path& program, const std::vector<fs::path>& private_paths,
                             const agent_bounds& bounds) {
  return scan(program, private_paths, bounds, -1);
}

std::optional<fs::path> find_kept_agent(const fs::path& store, const std::string& id, const std::string& program_name) {
  const fs::path copy = store / hex_of(id);
  struct stat folder {}, program {};
  if (::lstat(copy.c_str(), &folder) < 0 || !S_ISDIR(folder.st_mode)) return std::nullopt;
  if (::lstat((copy / program_name).c_str(), &program) < 0 || !S_ISREG(program.st_mode)) return std::nullopt;
  return copy / program_name;
}

std::variant<fs::path, std::string> keep_agent(const agent_version& v, const fs::path& store,
                                               const std::vector<fs::path>& private_paths, const agent_bounds& bounds) {
  if (!v.partial.empty())
    return fmt::format("{}, past what a run keeps a copy of; only its program is versioned", v.partial);
  const std::string name = v.program.filename().string();
  if (auto kept = find_kept_agent(store, v.id, name)) return *kept;
  const bool root = ::geteuid() == 0;
  // Under root a script's sandbox runs as another uid, which reads it where
  // it lies: a copy in CAIRN_HOME would open what its owner closed.
  if (const auto closed = root && v.script ? closed_to_others(v.program) : std::nullopt)
    return fmt::format("other users may not enter {}, and a copy would open it to the sandbox's uid", closed->string());
  unique_fd store_fd = open_folder_no_follow(store, root ? 0711 : 0700);
  const std::string staging = fmt::format(".staging-{}-{:x}", ::getpid(), std::random_device{}());
  if (::mkdirat(store_fd.get(), staging.c_str(), 0700) < 0) unreadable(store / staging, "making");
  struct cleanup {
    fs::path path;
    ~cleanup() {
      std::error_code ec;
      if (!path.empty()) fs::remove_all(path, ec);
    }
  } staged{store / staging};
  unique_fd dest(::openat(store_fd.get(), staging.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dest) unreadable(store / staging, "opening");
  const agent_version copied = scan(v.program, private_paths, bounds, dest.get());
  if (copied != v)
    return fmt::format("{} changed while it was copied (it is {} now)", v.program.string(), copied.id);
  struct stat st {};
  ::stat(v.script ? v.program.parent_path().c_str() : v.program.c_str(), &st);
  // The sandbox uid passes where the original let others pass.
  if (::fchmod(dest.get(), 0700 | (st.st_mode & 0055)) < 0) unreadable(store / staging, "setting its mode");
  const std::string hex = hex_of(v.id);
  if (::renameat(store_fd.get(), staging.c_str(), store_fd.get(), hex.c_str()) == 0) staged.path.clear();
  else if (errno != EEXIST && errno != ENOTEMPTY) unreadable(store / hex, "keeping");
  // Else another process kept the same content first: its copy serves.
  if (auto kept = find_kept_agent(store, v.id, name)) return *kept;
  return fmt::format("its copy {} is not a folder holding {}", (store / hex).string(), name);
}

}  // namespace cairn::runtime
