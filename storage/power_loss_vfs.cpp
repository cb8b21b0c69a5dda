#include "storage/power_loss_vfs.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace cairn::storage::testing {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t sector = 512;

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), "power-loss VFS: " + what);
}

// The durable image of `path` inside `images` ('/' cannot appear in a name).
fs::path image_of(const fs::path& images, const std::string& path) {
  std::string name = path;
  std::replace(name.begin(), name.end(), '/', '%');
  return images / name;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Whole or not at all: a host killed while it copies an image must not leave
// half of one (rename is atomic).
void write_all(const fs::path& path, const std::string& bytes) {
  const fs::path partial = path.string() + ".partial";
  int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open " + partial.string());
  for (std::size_t off = 0; off < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail("write " + path.string());
    }
    off += static_cast<std::size_t>(n);
  }
  ::close(fd);
  fs::rename(partial, path);
}

// One file as the disk would keep it; shared by every handle on the path.
struct durable_file {
  std::string path;
  fs::path image;
  bool entry_durable = false;  // its directory entry survives a cut
  bool syncs_folder = false;   // SQLite's unix VFS syncs the folder at its first sync
  std::vector<std::pair<sqlite3_int64, int>> dirty;  // written since the last sync
  std::mutex m;

  void written(sqlite3_int64 offset, int amount) {
    std::lock_guard lock(m);
    dirty.emplace_back(offset, amount);
  }

  // What fsync promises: every write so far is in the image, at the file's size now.
  void sync() {
    std::lock_guard lock(m);
    if (!entry_durable && !syncs_folder) {
      dirty.clear();  // content without a directory entry is lost anyway
      return;
    }
    if (!entry_durable) {
      write_all(image, read_all(path));
      entry_durable = true;
      dirty.clear();
      return;
    }
    int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) fail("open " + path);
    int out = ::open(image.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) fail("open " + image.string());
    std::vector<char> buf;
    for (auto [offset, amount] : dirty) {
      buf.resize(static_cast<std::size_t>(amount));
      ssize_t n = ::pread(in, buf.data(), buf.size(), offset);
      if (n > 0 && ::pwrite(out, buf.data(), static_cast<std::size_t>(n), offset) != n) fail("write " + image.string());
    }
    struct stat st {};
    if (::fstat(in, &st) < 0 || ::ftruncate(out, st.st_size) < 0) fail("resize " + image.string());
    ::close(in);
    ::close(out);
    dirty.clear();
  }
};

struct registry {
  fs::path images;
  std::mutex m;
  std::map<std::string, std::shared_ptr<durable_file>> files;
  sqlite3_vfs* base = nullptr;

  std::shared_ptr<durable_file> track(const std::string& path, bool existed, int type) {
    std::lock_guard lock(m);
    auto& slot = files[path];
    if (slot) return slot;
    slot = std::make_shared<durable_file>();
    slot->path = path;
    slot->image = image_of(images, path);
    slot->syncs_folder = type == SQLITE_OPEN_WAL || type == SQLITE_OPEN_MAIN_JOURNAL ||
                         type == SQLITE_OPEN_SUPER_JOURNAL;
    // A file found on disk is taken as durable as it is. A new one keeps the
    // image a delete in this process left behind, if that delete was never
    // made durable; files absent when this process came are durably absent.
    if (existed) write_all(slot->image, read_all(path));
    else if (!deleted_here.contains(path)) fs::remove(slot->image);
    slot->entry_durable = existed;
    std::ofstream(images / "tracked", std::ios::app) << path << '\n';
    return slot;
  }

  void deleted(const std::string& path, bool folder_synced) {
    std::lock_guard lock(m);
    files.erase(path);
    deleted_here.insert(path);
    if (folder_synced) fs::remove(image_of(images, path));
  }
  std::set<std::string> deleted_here;
};

registry& the_registry() {
  static registry r;
  return r;
}

// SQLite allocates szOsFile bytes for a handle: this header, then the base
// VFS's own handle.
struct handle {
  sqlite3_file header;
  std::shared_ptr<durable_file> file;  // null: a temporary file, not modelled
  sqlite3_file* real() { return reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(this) + offset()); }
  static constexpr std::size_t offset() { return (sizeof(handle) + 15) / 16 * 16; }
};

handle* as_handle(sqlite3_file* f) { return reinterpret_cast<handle*>(f); }
sqlite3_file* real(sqlite3_file* f) { return as_handle(f)->real(); }

int x_close(sqlite3_file* f) {
  int rc = real(f)->pMethods->xClose(real(f));
  as_handle(f)->~handle();
  return rc;
}
int x_read(sqlite3_file* f, void* buf, int amount, sqlite3_int64 offset) {
  return real(f)->pMethods->xRead(real(f), buf, amount, offset);
}
int x_write(sqlite3_file* f, const void* buf, int amount, sqlite3_int64 offset) {
  int rc = real(f)->pMethods->xWrite(real(f), buf, amount, offset);
  if (rc == SQLITE_OK && as_handle(f)->file) as_handle(f)->file->written(offset, amount);
  return rc;
}
int x_truncate(sqlite3_file* f, sqlite3_int64 size) { return real(f)->pMethods->xTruncate(real(f), size); }
int x_sync(sqlite3_file* f, int) {
  if (!as_handle(f)->file) return SQLITE_OK;
  try {
    as_handle(f)->file->sync();
  } catch (const std::exception&) {
    return SQLITE_IOERR_FSYNC;
  }
  return SQLITE_OK;
}
int x_file_size(sqlite3_file* f, sqlite3_int64* size) { return real(f)->pMethods->xFileSize(real(f), size); }
int x_lock(sqlite3_file* f, int level) { return real(f)->pMethods->xLock(real(f), level); }
int x_unlock(sqlite3_file* f, int level) { return real(f)->pMethods->xUnlock(real(f), level); }
int x_check_reserved(sqlite3_file* f, int* out) { return real(f)->pMethods->xCheckReservedLock(real(f), out); }
int x_file_control(sqlite3_file* f, int op, void* arg) { return real(f)->pMethods->xFileControl(real(f), op, arg); }
int x_sector_size(sqlite3_file* f) { return real(f)->pMethods->xSectorSize(real(f)); }
int x_device(sqlite3_file* f) { return real(f)->pMethods->xDeviceCharacteristics(real(f)); }
int x_shm_map(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
  return real(f)->pMethods->xShmMap(real(f), region, size, extend, out);
}
int x_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
  return real(f)->pMethods->xShmLock(real(f), offset, n, flags);
}
void x_shm_barrier(sqlite3_file* f) { real(f)->pMethods->xShmBarrier(real(f)); }
int x_shm_unmap(sqlite3_file* f, int remove) { return real(f)->pMethods->xShmUnmap(real(f), remove); }
int x_fetch(sqlite3_file* f, sqlite3_int64 offset, int amount, void** out) {
  return real(f)->pMethods->xFetch(real(f), offset, amount, out);
}
int x_unfetch(sqlite3_file* f, sqlite3_int64 offset, void* p) {
  return real(f)->pMethods->xUnfetch(real(f), offset, p);
}

const sqlite3_io_methods methods = {
    3,        x_close,   x_read,        x_write,       x_truncate,  x_sync,         x_file_size,
    x_lock,   x_unlock,  x_check_reserved, x_file_control, x_sector_size, x_device, x_shm_map,
    x_shm_lock, x_shm_barrier, x_shm_unmap, x_fetch,    x_unfetch,
};

int x_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  auto& r = the_registry();
  const int type = flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL |
                            SQLITE_OPEN_SUPER_JOURNAL | SQLITE_OPEN_TEMP_DB | SQLITE_OPEN_TEMP_JOURNAL |
                            SQLITE_OPEN_TRANSIENT_DB | SQLITE_OPEN_SUBJOURNAL);
  const bool modelled = name && (type == SQLITE_OPEN_MAIN_DB || type == SQLITE_OPEN_MAIN_JOURNAL ||
                                 type == SQLITE_OPEN_WAL || type == SQLITE_OPEN_SUPER_JOURNAL);
  const bool existed = name && ::access(name, F_OK) == 0;
  auto* h = new (f) handle{};
  h->header.pMethods = nullptr;
  int rc = r.base->xOpen(r.base, name, h->real(), flags, out_flags);
  if (rc != SQLITE_OK) {
    h->~handle();
    f->pMethods = nullptr;
    return rc;
  }
  if (modelled) {
    try {
      h->file = r.track(name, existed, type);
    } catch (const std::exception&) {
      h->real()->pMethods->xClose(h->real());
      h->~handle();
      f->pMethods = nullptr;
      return SQLITE_IOERR;
    }
  }
  h->header.pMethods = &methods;
  return SQLITE_OK;
}

int x_delete(sqlite3_vfs*, const char* name, int sync_dir) {
  auto& r = the_registry();
  int rc = r.base->xDelete(r.base, name, sync_dir);
  if (rc == SQLITE_OK) r.deleted(name, sync_dir != 0);
  return rc;
}

}  // namespace

void install_power_loss_vfs(const fs::path& images) {
  auto& r = the_registry();
  if (r.base) throw std::logic_error("power-loss VFS: installed twice in one process");
  fs::create_directories(images);
  r.images = images;
  r.base = sqlite3_vfs_find(nullptr);
  if (!r.base) throw std::runtime_error("power-loss VFS: SQLite has no default VFS");
  // Everything but opening and deleting is the base VFS's own, which reads
  // only the fields copied with it (pAppData, mxPathname).
  static sqlite3_vfs vfs = *r.base;
  vfs.pNext = nullptr;
  vfs.szOsFile = static_cast<int>(handle::offset()) + r.base->szOsFile;
  vfs.zName = "cairn-power-loss";
  vfs.xOpen = x_open;
  vfs.xDelete = x_delete;
  if (sqlite3_vfs_register(&vfs, 1) != SQLITE_OK) throw std::runtime_error("power-loss VFS: cannot register");
}

void cut_power(const fs::path& images, std::mt19937_64* tear) {
  std::set<std::string> paths;
  std::ifstream in(images / "tracked");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) paths.insert(line);
  for (const auto& path : paths) {
    const auto image = image_of(images, path);
    std::error_code ec;
    if (!fs::exists(image, ec)) {
      fs::remove(path, ec);
      continue;
    }
    std::string durable = read_all(image);
    if (tear) {
      const std::string now = read_all(path);
      for (std::size_t at = 0; at < durable.size() && at < now.size(); at += sector) {
        const auto n = std::min({sector, durable.size() - at, now.size() - at});
        if (durable.compare(at, n, now, at, n) != 0 && (*tear)() % 2 == 0) durable.replace(at, n, now, at, n);
      }
    }
    write_all(path, durable);
  }
  for (const auto& path : paths) {
    std::error_code ec;
    fs::remove(path + "-shm", ec);
  }
}

}  // namespace cairn::storage::testing
