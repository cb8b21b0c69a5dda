#include "engine/workspace_checkpoints.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "engine/effects.hpp"
#include "engine/engine.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/tree_copy.hpp"
#include "runtime/workspace_changes.hpp"

namespace cairn::engine {
namespace {

storage::storage_error unreadable(std::string_view run_id, const storage::event_record& e, std::string_view why) {
  return storage::storage_error(storage::errc::corrupt, fmt::format("the workspace checkpoint of step {} of run {} "
                                                                    "cannot be read: {}",
                                                                    e.seq.value_or(0), run_id, why));
}

// "a/b" names an entry under the workspace: no empty, "." or ".." component, not absolute.
bool valid_path(std::string_view path) {
  if (path.empty() || path.size() > 4096) return false;
  std::size_t at = 0;
  for (;;) {
    const auto slash = path.find('/', at);
    const auto part = path.substr(at, slash == std::string_view::npos ? std::string_view::npos : slash - at);
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string_view::npos) return false;
    if (slash == std::string_view::npos) return true;
    at = slash + 1;
  }
}

checkpoint_entry entry_of(const json& j) {
  checkpoint_entry e;
  const std::string t = j.at("t").get<std::string>();
  if (t.size() != 1 || (t[0] != 'f' && t[0] != 'd' && t[0] != 'l')) throw std::invalid_argument("an unknown type");
  e.type = t[0];
  e.mode = j.value("m", 0u) & 07777u;
  if (e.type == 'f') {
    e.size = j.at("s").get<std::uint64_t>();
    e.mtime_ns = j.value("mt", std::int64_t{0});
    e.pieces = j.at("p").get<std::vector<std::string>>();
  } else if (e.type == 'l') {
    e.target = j.at("to").get<std::string>();
  }
  return e;
}

// Removes `path` and everything under it.
void erase_tree(workspace_state& state, const std::string& path) {
  state.erase(path);
  const std::string prefix = path + "/";
  for (auto it = state.lower_bound(prefix); it != state.end() && it->first.starts_with(prefix);) it = state.erase(it);
}

}  // namespace

void apply_checkpoint(workspace_state& state, const json& data) {
  const auto checked = [](const std::string& path) -> const std::string& {
    if (!valid_path(path)) throw std::invalid_argument("'" + path + "' names no entry under the workspace");
    return path;
  };
  // Held here: a range-for over value()'s temporary would outlive it.
  const json removed = data.value("removed", json::array()), files = data.value("files", json::object());
  for (const auto& path : removed) erase_tree(state, checked(path.get<std::string>()));
  for (const auto& [path, entry] : files.items()) {
    checked(path);
    auto e = entry_of(entry);
    if (e.type != 'd') erase_tree(state, path);  // a folder replaced by a file
    state[path] = std::move(e);
  }
}

namespace {

bool is_baseline(const storage::event_record& e) { return e.kind == baseline_event; }
bool is_checkpoint_until(const storage::event_record& e, std::optional<std::uint64_t> seq) {
  return e.kind == checkpoint_event && e.seq && (!seq || *e.seq <= *seq);
}

}  // namespace

workspace_state checkpoint_state(storage::journal& journal, std::string_view run_id, std::optional<std::uint64_t> seq) {
  return checkpoint_state(journal.events(run_id), run_id, seq);
}

workspace_state checkpoint_state(std::span<const storage::event_record> events, std::string_view run_id,
                                 std::optional<std::uint64_t> seq) {
  workspace_state state;
  const auto fold = [&](const storage::event_record& e) {
    try {
      apply_checkpoint(state, e.data);
    } catch (const std::exception& ex) {
      throw unreadable(run_id, e, ex.what());
    }
  };
  for (const auto& e : events)
    if (is_baseline(e)) fold(e);
  for (const auto& e : events)
    if (is_checkpoint_until(e, seq)) fold(e);
  return state;
}

bool has_checkpoint(storage::journal& journal, std::string_view run_id, std::uint64_t seq) {
  for (const auto& e : journal.events(run_id))
    if (is_baseline(e) || is_checkpoint_until(e, seq)) return true;
  return false;
}

namespace {

namespace fs = std::filesystem;

constexpr std::size_t piece_bytes = 1 << 20;
constexpr std::size_t max_checkpoint_entries = 200'000;
constexpr int zstd_level = 1;  // fast: a checkpoint is on its step's way to the ack

std::string sha256_digest(const char* data, std::size_t n) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data, n, digest, &size, EVP_sha256(), nullptr) != 1) throw std::runtime_error("SHA-256 failed");
  std::string out = "sha256:";
  for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

// A piece as the journal keeps it: "z" and its zstd frame, or "r" and its
// bytes where compressing saves nothing.
storage::blob pack(std::string digest, std::string_view bytes) {
  storage::blob b{std::move(digest), bytes.size(), {}};
  std::string z(1 + ZSTD_compressBound(bytes.size()), '\0');
  z[0] = 'z';
  // One context per thread: ZSTD_compress makes and frees one per call,
  // which costs more than compressing a small piece.
  thread_local const std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> context(ZSTD_createCCtx(), ZSTD_freeCCtx);
  const std::size_t n =
      ZSTD_compressCCtx(context.get(), z.data() + 1, z.size() - 1, bytes.data(), bytes.size(), zstd_level);
  if (!ZSTD_isError(n) && n < bytes.size()) {
    z.resize(1 + n);
    b.data = std::move(z);
  } else {
    b.data = "r";
    b.data.append(bytes);
  }
  return b;
}

[[noreturn]] void bad_piece(const std::string& digest, std::string_view why) {
  throw engine_error(errc::not_found, fmt::format("the workspace piece {} in the journal {}", digest, why));
}

}  // namespace

std::string unpack_piece(const storage::blob& b) {
  const std::string& digest = b.digest;
  if (b.size > piece_bytes) bad_piece(digest, "is larger than a piece may be");
  std::string out;
  if (!b.data.empty() && b.data[0] == 'r') {
    out = b.data.substr(1);
  } else if (!b.data.empty() && b.data[0] == 'z') {
    const auto frame = ZSTD_getFrameContentSize(b.data.data() + 1, b.data.size() - 1);
    if (frame != b.size) bad_piece(digest, "does not say its size");
    out.resize(b.size);
    const auto n = ZSTD_decompress(out.data(), out.size(), b.data.data() + 1, b.data.size() - 1);
    if (ZSTD_isError(n) || n != b.size) bad_piece(digest, "cannot be decompressed");
  } else {
    bad_piece(digest, "is of no known encoding");
  }
  if (out.size() != b.size || sha256_digest(out.data(), out.size()) != digest) bad_piece(digest, "does not match its digest");
  return out;
}

namespace {

// The bytes of `digest`, found by `find` and checked against it.
std::string unpack(const piece_source& find, const std::string& digest) {
  auto b = find(digest);
  if (!b) bad_piece(digest, "is missing");
  return unpack_piece(*b);
}

json entry_json(const checkpoint_entry& e) {
  json j = {{"t", std::string(1, e.type)}, {"m", e.mode}};
  if (e.type == 'f') {
    j["s"] = e.size;
    j["mt"] = e.mtime_ns;
    j["p"] = e.pieces;
  } else if (e.type == 'l') {
    j["to"] = e.target;
  }
  return j;
}

std::pair<std::string, std::string> split_path(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return {"", path};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

std::int64_t mtime_ns_of(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// What is at `path` under `root`, its metadata only (a file's pieces
// empty); nullopt when nothing is, a component is a link, or it is no
// file, folder or link (a fifo, a socket, a device: not kept).
std::optional<checkpoint_entry> look(int root, const std::string& path) {
  const auto [parent, name] = split_path(path);
  runtime::unique_fd dir = runtime::open_beneath(root, parent, O_PATH | O_DIRECTORY);
  if (!dir) return std::nullopt;
  struct stat st {};
  if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) return std::nullopt;
  checkpoint_entry e;
  e.mode = st.st_mode & 07777;
  if (S_ISDIR(st.st_mode)) {
    e.type = 'd';
  } else if (S_ISREG(st.st_mode)) {
    e.type = 'f';
    e.size = static_cast<std::uint64_t>(st.st_size);
    e.mtime_ns = mtime_ns_of(st);
  } else if (S_ISLNK(st.st_mode)) {
    e.type = 'l';
    std::string target(4096, '\0');
    const ssize_t n = ::readlinkat(dir.get(), name.c_str(), target.data(), target.size());
    if (n < 0) return std::nullopt;
    target.resize(static_cast<std::size_t>(n));
    e.target = std::move(target);
  } else {
    return std::nullopt;
  }
  return e;
}

// Same type and metadata: what an attempt's walk takes as unchanged.
bool same_metadata(const checkpoint_entry& a, const checkpoint_entry& b) {
  return a.type == b.type && a.mode == b.mode && a.size == b.size && a.mtime_ns == b.mtime_ns && a.target == b.target;
}

// Everything under `path` ("" the root), metadata only, folders before what they hold.
void scan(int root, const std::string& path, workspace_state& into) {
  runtime::unique_fd dir = runtime::open_beneath(root, path, O_RDONLY | O_DIRECTORY);
  if (!dir) return;
  runtime::walk_tree_no_follow(dir.get(), path, [&](int, const char*, const fs::path& where) {
    const std::string at = where.string();
    if (auto e = look(root, at)) into[at] = std::move(*e);
  });
}

// A file's pieces, read without following a link and never blocking on
// what is no regular file; nullopt when it cannot be read as one now.
std::optional<found_entry> read_pieces(int root, const std::string& path) {
  runtime::unique_fd fd = runtime::open_beneath(root, path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (!fd) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) < 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  found_entry out;
  out.entry.type = 'f';
  out.entry.mode = st.st_mode & 07777;
  out.entry.mtime_ns = mtime_ns_of(st);
  // What it held as it was opened; what it grows by meanwhile is the next checkpoint's.
  std::uint64_t left = static_cast<std::uint64_t>(st.st_size);
  std::string buffer;
  while (left > 0) {
    buffer.resize(static_cast<std::size_t>(std::min<std::uint64_t>(left, piece_bytes)));
    std::size_t got = 0;
    while (got < buffer.size()) {
      const ssize_t n = ::read(fd.get(), buffer.data() + got, buffer.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::nullopt;
      if (n == 0) break;  // it shrank meanwhile
      got += static_cast<std::size_t>(n);
    }
    buffer.resize(got);
    if (got == 0) break;
    out.entry.size += got;
    out.entry.pieces.push_back(sha256_digest(buffer.data(), buffer.size()));
    out.pieces.emplace_back(out.entry.pieces.back(), buffer);
    left -= got;
    if (got < piece_bytes && left > 0) break;
  }
  return out;
}

// Removes `path` under `root` (a folder with what it holds), following no link.
void remove_entry(int root, const std::string& path) {
  const auto [parent, name] = split_path(path);
  runtime::unique_fd dir = runtime::open_beneath(root, parent, O_PATH | O_DIRECTORY);
  if (!dir) return;
  struct stat st {};
  if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) return;
  if (S_ISDIR(st.st_mode)) {
    runtime::unique_fd sub = runtime::open_beneath(root, path, O_RDONLY | O_DIRECTORY);
    if (sub) runtime::clear_tree(sub.get(), path);
    if (::unlinkat(dir.get(), name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return;
  } else if (::unlinkat(dir.get(), name.c_str(), 0) == 0 || errno == ENOENT) {
    return;
  }
  throw runtime::sandbox_error(runtime::sandbox_errc::workspace_failed,
                               fmt::format("cannot remove {} from the workspace: {}", path, std::strerror(errno)));
}

[[noreturn]] void cannot_write(const std::string& path, const char* doing) {
  throw runtime::sandbox_error(runtime::sandbox_errc::workspace_failed,
                               fmt::format("cannot put {} back into the workspace: {}: {}", path, doing,
                                           std::strerror(errno)));
}

// Writes `e` at `path` under `root` (its folder there already), its pieces
// read from the journal, owned like the root when this is root. A file or
// link is made beside and renamed into place.
void put_entry(const piece_source& find, int root, const std::string& path, const checkpoint_entry& e,
               const struct stat& owner) {
  static std::atomic<unsigned> made{0};
  const auto [parent, name] = split_path(path);
  runtime::unique_fd dir = runtime::open_beneath(root, parent, O_PATH | O_DIRECTORY);
  if (!dir) cannot_write(path, "its folder");
  const bool chown = ::geteuid() == 0;
  if (e.type == 'd') {
    if (::mkdirat(dir.get(), name.c_str(), 0700) < 0 && errno != EEXIST) cannot_write(path, "mkdir");
    runtime::unique_fd sub = runtime::open_beneath(root, path, O_RDONLY | O_DIRECTORY);
    if (!sub) cannot_write(path, "open");
    if (chown && ::fchown(sub.get(), owner.st_uid, owner.st_gid) < 0) cannot_write(path, "chown");
    if (::fchmod(sub.get(), e.mode) < 0) cannot_write(path, "chmod");
    return;
  }
  const std::string temp = fmt::format(".cairn-restore.{}.{}", ::getpid(), made++);
  if (e.type == 'l') {
    if (::symlinkat(e.target.c_str(), dir.get(), temp.c_str()) < 0) cannot_write(path, "symlink");
    if (chown) ::fchownat(dir.get(), temp.c_str(), owner.st_uid, owner.st_gid, AT_SYMLINK_NOFOLLOW);
  } else {
    runtime::unique_fd fd(::openat(dir.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) cannot_write(path, "create");
    for (const auto& digest : e.pieces) {
      const std::string bytes = unpack(find, digest);
      for (std::size_t at = 0; at < bytes.size();) {
        const ssize_t n = ::write(fd.get(), bytes.data() + at, bytes.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          ::unlinkat(dir.get(), temp.c_str(), 0);
          cannot_write(path, "write");
        }
        at += static_cast<std::size_t>(n);
      }
    }
    if (chown && ::fchown(fd.get(), owner.st_uid, owner.st_gid) < 0) cannot_write(path, "chown");
    if (::fchmod(fd.get(), e.mode) < 0) cannot_write(path, "chmod");
    const timespec times[2] = {{0, UTIME_OMIT}, {e.mtime_ns / 1'000'000'000, e.mtime_ns % 1'000'000'000}};
    ::futimens(fd.get(), times);  // so that the next attempt's walk finds it unchanged
  }
  // A folder in the way goes first (renameat cannot replace it with a file).
  struct stat there {};
  if (::fstatat(dir.get(), name.c_str(), &there, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(there.st_mode))
    remove_entry(root, path);
  if (::renameat(dir.get(), temp.c_str(), dir.get(), name.c_str()) < 0) {
    ::unlinkat(dir.get(), temp.c_str(), 0);
    cannot_write(path, "rename");
  }
}

// Makes what is under `root` (`now`, metadata) what `want` holds; returns
// how many entries it removed or wrote.
std::size_t put_back(const piece_source& find, int root, const workspace_state& want, const workspace_state& now) {
  struct stat owner {};
  if (::fstat(root, &owner) < 0) cannot_write(".", "stat");
  std::size_t changed = 0;
  // What must go: not wanted, or wanted as another type. Folders before what they hold, so one removal takes all.
  std::string removed_tree;
  for (const auto& [path, e] : now) {
    if (!removed_tree.empty() && path.starts_with(removed_tree + "/")) continue;
    auto w = want.find(path);
    if (w != want.end() && w->second.type == e.type) continue;
    remove_entry(root, path);
    ++changed;
    removed_tree = path;
  }
  for (const auto& [path, e] : want) {
    // Kept: there with its type (a folder removed above held nothing wanted).
    auto n = now.find(path);
    const bool kept = n != now.end() && n->second.type == e.type;
    if (kept && (e.type == 'd' ? n->second.mode == e.mode : same_metadata(n->second, e))) continue;
    put_entry(find, root, path, e, owner);
    ++changed;
  }
  return changed;
}

}  // namespace

std::uint64_t checkpoint_bytes(storage::journal& journal, std::string_view run_id) {
  std::uint64_t total = 0;
  for (const auto& e : journal.events(run_id))
    if ((e.kind == checkpoint_event || is_baseline(e)) && e.data.is_object())
      total += e.data.value("bytes", std::uint64_t{0});
  return total;
}

namespace {

bool crashed_before_last(const std::vector<storage::event_record>& events) {
  // The events from the attempt before the current one up to the current one.
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == "attempt_started") starts.push_back(i);
  if (starts.size() < 2) return false;
  for (std::size_t i = starts[starts.size() - 2] + 1; i < starts.back(); ++i) {
    const auto& kind = events[i].kind;
    if (kind == "attempt_crashed") return true;
    if (kind == "run_waiting" || kind == "run_released" || kind == "run_completed" || kind == "run_failed" ||
        kind == "run_cancelled" || kind == "run_in_doubt" || kind == "run_reset")
      return false;
  }
  return true;  // no end at all: its host died
}

}  // namespace

checkpoint_history checkpoint_history_of(std::string_view run_id, const std::vector<storage::event_record>& events) {
  checkpoint_history h;
  const auto fold = [&](const storage::event_record& e) {
    try {
      apply_checkpoint(h.state, e.data);
    } catch (const std::exception& ex) {
      throw unreadable(run_id, e, ex.what());
    }
    h.any = true;
    if (e.data.is_object()) h.bytes += e.data.value("bytes", std::uint64_t{0});
  };
  for (const auto& e : events)
    if (is_baseline(e)) fold(e);
  for (const auto& e : events)
    if (is_checkpoint_until(e, std::nullopt)) fold(e);
  h.previous_crashed = crashed_before_last(events);
  return h;
}

piece_source pieces_of(storage::journal& journal) {
  return [&journal](const std::string& digest) { return journal.find_blob(digest); };
}

void materialize(storage::journal& journal, const workspace_state& state, const fs::path& folder) {
  materialize(pieces_of(journal), state, folder);
}

void materialize(const piece_source& find, const workspace_state& state, const fs::path& folder) {
  runtime::unique_fd root = runtime::open_folder_no_follow(folder, 0700);
  workspace_state now;
  scan(root.get(), "", now);
  if (!now.empty())
    throw engine_error(errc::bad_request, fmt::format("{} is not empty: a checkpoint's files go into an empty folder",
                                                   folder.string()));
  put_back(find, root.get(), state, now);
}

workspace_state fork_checkpoints(storage::journal& journal, std::string_view from, std::uint64_t seq,
                                 std::string_view to) {
  std::set<std::string> used;
  for (const auto& e : journal.events(from)) {
    if (is_baseline(e)) journal.append_event(to, baseline_event, e.data, std::nullopt);  // the fork copied steps' events only
    if (!is_baseline(e) && !is_checkpoint_until(e, seq)) continue;
    const json files = e.data.value("files", json::object());
    for (const auto& [path, entry] : files.items()) {
      const json pieces = entry.value("p", json::array());
      for (const auto& digest : pieces) used.insert(digest.get<std::string>());
    }
  }
  const std::vector<std::string> digests(used.begin(), used.end());
  journal.put_blobs(to, {}, digests);
  return checkpoint_state(journal, from, seq);
}

void read_checkpoint_file(storage::journal& journal, const checkpoint_entry& e, std::uint64_t max_bytes,
                          const std::function<void(const char*, std::size_t)>& take) {
  read_checkpoint_file(pieces_of(journal), e, max_bytes, take);
}

void read_checkpoint_file(const piece_source& find, const checkpoint_entry& e, std::uint64_t max_bytes,
                          const std::function<void(const char*, std::size_t)>& take) {
  std::uint64_t given = 0;
  for (const auto& digest : e.pieces) {
    if (given >= max_bytes) return;
    const std::string bytes = unpack(find, digest);
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), max_bytes - given));
    take(bytes.data(), n);
    given += n;
  }
}

std::vector<workspace_change> diff_states(const workspace_state& a, const workspace_state& b) {
  std::vector<workspace_change> out;
  const auto alike = [](const checkpoint_entry& x, const checkpoint_entry& y) {
    return x.type == y.type && x.mode == y.mode && x.pieces == y.pieces && x.target == y.target && x.size == y.size;
  };
  auto i = a.begin();
  auto j = b.begin();
  while (i != a.end() || j != b.end()) {
    if (j == b.end() || (i != a.end() && i->first < j->first)) {
      out.push_back({'-', i->first, i->second, std::nullopt});
      ++i;
    } else if (i == a.end() || j->first < i->first) {
      out.push_back({'+', j->first, std::nullopt, j->second});
      ++j;
    } else {
      if (!alike(i->second, j->second)) out.push_back({'M', i->first, i->second, j->second});
      ++i, ++j;
    }
  }
  return out;
}

workspace_state checkpoint_at(storage::journal& journal, std::string_view run_id, std::uint64_t seq) {
  const auto steps = journal.step_count(run_id);
  if (seq >= steps)
    throw engine_error(errc::not_found,
                       steps == 0 ? fmt::format("run {} has no step yet", run_id)
                                  : fmt::format("run {} has no step {}: its steps are 0 to {}", run_id, seq, steps - 1));
  if (!has_checkpoint(journal, run_id, seq))
    throw engine_error(errc::not_found,
                       fmt::format("run {} kept no workspace checkpoint at or before step {} (its policy's "
                                   "limits.checkpoint_mb is 0, its workspace was empty until then, or a cairn that "
                                   "kept none ran it)",
                                   run_id, seq));
  return checkpoint_state(journal, run_id, seq);
}

found_entry found_file(std::string_view bytes, std::uint32_t mode, std::int64_t mtime_ns) {
  found_entry out;
  out.entry.type = 'f';
  out.entry.mode = mode & 07777;
  out.entry.mtime_ns = mtime_ns;
  out.entry.size = bytes.size();
  for (std::size_t at = 0; at < bytes.size(); at += piece_bytes) {
    const auto piece = bytes.substr(at, piece_bytes);
    out.entry.pieces.push_back(sha256_digest(piece.data(), piece.size()));
    out.pieces.emplace_back(out.entry.pieces.back(), std::string(piece));
  }
  return out;
}

checkpoint_chain::checkpoint_chain(workspace_state state, std::uint64_t budget_bytes, std::uint64_t spent_bytes)
    : state_(std::move(state)), budget_(budget_bytes), spent_(spent_bytes) {
  for (const auto& [path, e] : state_) known_.insert(e.pieces.begin(), e.pieces.end());
}

std::optional<workspace_checkpoint> checkpoint_chain::next(
    const std::map<std::string, std::optional<found_entry>>& found) {
  json files = json::object();
  std::set<std::string> removed;
  workspace_checkpoint out;
  std::uint64_t bytes = 0;
  std::set<std::string> used;
  for (const auto& [path, now] : found) {
    if (!valid_path(path)) continue;
    const auto before = state_.find(path);
    if (!now) {
      if (before != state_.end()) removed.insert(path);
      continue;
    }
    for (const auto& [digest, piece] : now->pieces) {
      used.insert(digest);
      if (known_.contains(digest)) continue;
      auto b = pack(digest, piece);
      bytes += b.data.size();
      out.blobs.push_back(std::move(b));
      known_.insert(digest);
    }
    if (before != state_.end() && before->second == now->entry) continue;
    files[path] = entry_json(now->entry);
  }
  // A path under one removed is removed with it.
  std::string last;
  json gone = json::array();
  for (const auto& path : removed) {
    if (!last.empty() && path.starts_with(last + "/")) continue;
    gone.push_back(path);
    last = path;
  }
  if (files.empty() && gone.empty()) return std::nullopt;
  if (budget_ > 0 && spent_ + bytes > budget_)
    throw budget_exceeded{"checkpoint_mb",
                          fmt::format("the run's workspace checkpoints would grow past {} MiB (limits.checkpoint_mb "
                                      "in the policy): it has stored {} MiB of its files' changes and this step "
                                      "adds {} MiB; raise the limit, or set it to 0 to keep no checkpoints",
                                      budget_ >> 20, spent_ >> 20, (bytes + (1 << 20) - 1) >> 20)};
  spent_ += bytes;
  out.data = {{"files", std::move(files)}, {"removed", std::move(gone)}, {"bytes", bytes}};
  out.used.assign(used.begin(), used.end());
  apply_checkpoint(state_, out.data);
  return out;
}

struct workspace_checkpointer::impl {
  runtime::workspace_changes changes;
  checkpoint_chain chain;
  std::set<std::string> pending;  // what the walk as the attempt began found changed

  impl(const fs::path& folder, workspace_state s, std::uint64_t b, std::uint64_t used)
      : changes(folder), chain(std::move(s), b, used) {}

  int root() const { return changes.root_fd(); }
  const workspace_state& state() const { return chain.state(); }

  // Every path whose metadata differs from the state's, or that one has and the other not.
  std::set<std::string> differing(const workspace_state& now) const {
    std::set<std::string> out;
    for (const auto& [path, e] : now)
      if (auto s = state().find(path); s == state().end() || !same_metadata(s->second, e)) out.insert(path);
    for (const auto& [path, e] : state())
      if (!now.contains(path)) out.insert(path);
    return out;
  }
};

workspace_checkpointer::workspace_checkpointer(const piece_source& pieces, const fs::path& folder,
                                               workspace_state state, bool roll_back, std::uint64_t budget_bytes,
                                               std::uint64_t spent_bytes)
    : impl_(std::make_unique<impl>(folder, std::move(state), budget_bytes, spent_bytes)) {
  // Watched first, then walked: a change made meanwhile is seen by one or the other.
  workspace_state now;
  scan(impl_->root(), "", now);
  if (roll_back) {
    rolled_back_ = put_back(pieces, impl_->root(), impl_->state(), now);
  } else {
    impl_->pending = impl_->differing(now);
  }
}

workspace_checkpointer::~workspace_checkpointer() = default;

std::optional<workspace_checkpoint> workspace_checkpointer::take() {
  auto& m = *impl_;
  auto seen = m.changes.take();
  std::set<std::string> paths = std::move(m.pending);
  m.pending.clear();
  paths.merge(seen.paths);
  if (seen.everything) {
    workspace_state now;
    scan(m.root(), "", now);
    paths.merge(m.differing(now));
  }
  // A folder that came (or came back) is looked at whole: what it held came unseen.
  for (const auto& path : std::set<std::string>(paths)) {
    auto e = look(m.root(), path);
    if (!e || e->type != 'd') continue;
    workspace_state under;
    scan(m.root(), path, under);
    for (const auto& [p, entry] : under) paths.insert(p);
    const std::string prefix = path + "/";
    for (auto it = m.state().lower_bound(prefix); it != m.state().end() && it->first.starts_with(prefix); ++it)
      paths.insert(it->first);
  }
  // Each entry is held, and journaled, at once: a step that touched more is refused, not read.
  if (paths.size() > max_checkpoint_entries)
    throw budget_exceeded{"checkpoint_mb", fmt::format("the step changed {} or more entries of the workspace, more "
                                                       "than one checkpoint holds ({}); keep fewer files, or set "
                                                       "limits.checkpoint_mb to 0 to keep no checkpoints",
                                                       paths.size(), max_checkpoint_entries)};
  std::map<std::string, std::optional<found_entry>> found;
  for (const auto& path : paths) {
    auto now = look(m.root(), path);
    if (!now) {
      found[path] = std::nullopt;
    } else if (now->type != 'f') {
      found[path] = found_entry{std::move(*now), {}};
    } else if (auto read = read_pieces(m.root(), path)) {
      found[path] = std::move(*read);
    }  // else unreadable now (gone again, or locked away): kept as it was
  }
  return m.chain.next(found);
}

}  // namespace cairn::engine
