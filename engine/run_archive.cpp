#include "engine/run_archive.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zstd.h>

#include <set>

#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/event_schema.hpp"
#include "engine/workspace_checkpoints.hpp"
#include "protocol/bounded_json.hpp"
#include "protocol/version.hpp"

namespace cairn::engine {
namespace {

// A piece holds at most 1 MiB (workspace_checkpoints.cpp); stored, with its
// encoding's byte and zstd's worst case, a little more.
constexpr std::uint64_t max_piece_entry = (1 << 20) + (64 << 10);
// A JSON entry is read whole into memory (the import writes its rows in one
// transaction): each at most this.
constexpr std::uint64_t max_json_entry = std::uint64_t{1} << 30;
constexpr std::uint64_t max_manifest = 64 << 20;
constexpr std::size_t io_block = 64 << 10;

[[noreturn]] void refuse(const std::string& why) { throw engine_error(errc::bad_request, why); }

// SHA-256, fed in pieces.
class sha256 {
 public:
  sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) throw std::runtime_error("SHA-256 failed");
  }
  ~sha256() { EVP_MD_CTX_free(ctx_); }
  sha256(const sha256&) = delete;
  sha256& operator=(const sha256&) = delete;
  void add(const void* data, std::size_t n) { EVP_DigestUpdate(ctx_, data, n); }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_, digest, &size);
    std::string out;
    for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", digest[i]);
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string sha256_hex(std::string_view bytes) {
  sha256 h;
  h.add(bytes.data(), bytes.size());
  return h.hex();
}

// "sha256:HEX" <-> "pieces/sha256-HEX"
std::string piece_entry(const std::string& digest) { return "pieces/sha256-" + digest.substr(7); }
bool is_digest(std::string_view d) {
  if (!d.starts_with("sha256:") || d.size() != 7 + 64) return false;
  return d.substr(7).find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Rows as the archive holds them.
json row(const storage::run_record& r) {
  json j = {{"id", r.id},
            {"agent", r.agent},
            {"input", r.input},
            {"status", storage::to_string(r.status)},
            {"output", r.output},
            {"attempts", r.attempts},
            {"max_attempts", r.max_attempts},
            {"sandbox", r.sandbox},
            {"created_at_ms", r.created_at_ms},
            {"finished_at_ms", r.finished_at_ms ? json(*r.finished_at_ms) : json()},
            {"policy", r.policy},
            {"parent_id", r.parent_id},
            {"cancel_requested_at_ms", r.cancel_requested_at_ms ? json(*r.cancel_requested_at_ms) : json()},
            {"cancel_reason", r.cancel_reason},
            {"deadline_ms", r.deadline_ms ? json(*r.deadline_ms) : json()}};
  j["error"] = r.error ? json{{"message", r.error->message}, {"type", r.error->type}} : json();
  if (r.wait)
    j["wait"] = {{"kind", r.wait->kind},
                 {"key", r.wait->key},
                 {"seq", r.wait->seq},
                 {"wake_at_ms", r.wait->wake_at_ms ? json(*r.wait->wake_at_ms) : json()}};
  else
    j["wait"] = nullptr;
  return j;
}

template <class T>
std::optional<T> optional_of(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<T>();
}

storage::run_record run_of(const json& j) {
  storage::run_record r;
  r.id = j.at("id").get<std::string>();
  r.agent = j.at("agent").get<std::string>();
  r.input = j.at("input");
  const auto status = storage::parse_run_status(j.at("status").get<std::string>());
  if (!status) throw std::invalid_argument("an unknown status");
  r.status = *status;
  r.output = j.at("output");
  if (const auto& e = j.at("error"); !e.is_null())
    r.error = protocol::error_info{e.at("message").get<std::string>(), e.at("type").get<std::string>()};
  r.attempts = j.at("attempts").get<int>();
  r.max_attempts = j.at("max_attempts").get<int>();
  if (r.attempts < 0 || r.max_attempts < 1 || r.attempts > 1'000'000) throw std::invalid_argument("attempts out of range");
  r.sandbox = j.at("sandbox").get<std::string>();
  r.created_at_ms = j.at("created_at_ms").get<std::int64_t>();
  r.finished_at_ms = optional_of<std::int64_t>(j, "finished_at_ms");
  r.policy = j.at("policy");
  r.parent_id = j.at("parent_id").get<std::string>();
  if (const auto& w = j.at("wait"); !w.is_null())
    r.wait = storage::wait_spec{w.at("kind").get<std::string>(), w.at("key").get<std::string>(),
                                w.at("seq").get<std::uint64_t>(), optional_of<std::int64_t>(w, "wake_at_ms")};
  r.cancel_requested_at_ms = optional_of<std::int64_t>(j, "cancel_requested_at_ms");
  r.cancel_reason = j.at("cancel_reason").get<std::string>();
  r.deadline_ms = optional_of<std::int64_t>(j, "deadline_ms");
  return r;
}

json row(const storage::step_record& s) {
  return {{"result", protocol::to_json(s.result)}, {"started_at_ms", s.started_at_ms}, {"finished_at_ms", s.finished_at_ms}};
}
storage::step_record step_of(const json& j) {
  return {"", protocol::parse_step_result(j.at("result")), j.at("started_at_ms").get<std::int64_t>(),
          j.at("finished_at_ms").get<std::int64_t>()};
}

json row(const storage::event_record& e) {
  return {{"id", e.id}, {"seq", e.seq ? json(*e.seq) : json()}, {"kind", e.kind}, {"data", e.data}, {"at_ms", e.at_ms}};
}
storage::event_record event_of(const json& j) {
  storage::event_record e;
  e.id = j.at("id").get<std::int64_t>();
  e.seq = optional_of<std::uint64_t>(j, "seq");
  e.kind = j.at("kind").get<std::string>();
  e.data = j.at("data");
  e.at_ms = j.at("at_ms").get<std::int64_t>();
  return e;
}

json row(const storage::signal_record& s) {
  return {{"id", s.id},
          {"name", s.name},
          {"payload", s.payload},
          {"sent_at_ms", s.sent_at_ms},
          {"delivered_seq", s.delivered_seq ? json(*s.delivered_seq) : json()},
          {"delivered_at_ms", s.delivered_at_ms ? json(*s.delivered_at_ms) : json()}};
}
storage::signal_record signal_of(const json& j) {
  storage::signal_record s;
  s.id = j.at("id").get<std::int64_t>();
  s.name = j.at("name").get<std::string>();
  s.payload = j.at("payload");
  s.sent_at_ms = j.at("sent_at_ms").get<std::int64_t>();
  s.delivered_seq = optional_of<std::uint64_t>(j, "delivered_seq");
  s.delivered_at_ms = optional_of<std::int64_t>(j, "delivered_at_ms");
  return s;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

template <class T>
std::string lines(const std::vector<T>& rows) {
  std::string out;
  for (const auto& r : rows) out += dump(row(r)) + "\n";
  return out;
}

// The pieces the checkpoint events of a run name, each once.
std::set<std::string> named_pieces(const std::vector<storage::event_record>& events) {
  std::set<std::string> out;
  for (const auto& e : events) {
    if (e.kind != checkpoint_event && e.kind != baseline_event) continue;
    const json files = e.data.value("files", json::object());
    for (const auto& [path, entry] : files.items())
      for (const auto& d : entry.value("p", json::array())) out.insert(d.get<std::string>());
  }
  return out;
}

// libarchive's writer on an fd, RAII.
class tar_writer {
 public:
  explicit tar_writer(int fd, std::int64_t mtime_s) : a_(archive_write_new()), mtime_s_(mtime_s) {
    // No padding after the last block: libarchive pads what goes to stdout
    // with zeros, which zstd (and tar --zstd) then refuse as trailing garbage.
    if (!a_ || archive_write_add_filter_zstd(a_) != ARCHIVE_OK || archive_write_set_format_pax_restricted(a_) != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(a_, 1) != ARCHIVE_OK || archive_write_open_fd(a_, fd) != ARCHIVE_OK)
      fail("cannot start the archive");
  }
  ~tar_writer() { archive_write_free(a_); }
  tar_writer(const tar_writer&) = delete;
  tar_writer& operator=(const tar_writer&) = delete;

  void add(const std::string& name, std::string_view bytes) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_size(e, static_cast<la_int64_t>(bytes.size()));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, mtime_s_, 0);
    const int r = archive_write_header(a_, e);
    archive_entry_free(e);
    if (r != ARCHIVE_OK) fail("cannot write " + name);
    for (std::size_t at = 0; at < bytes.size();) {
      const auto n = archive_write_data(a_, bytes.data() + at, std::min(bytes.size() - at, io_block));
      if (n <= 0) fail("cannot write " + name);
      at += static_cast<std::size_t>(n);
    }
  }
  void close() {
    if (archive_write_close(a_) != ARCHIVE_OK) fail("cannot finish the archive");
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    const char* why = archive_error_string(a_);
    throw std::runtime_error(fmt::format("export: {}: {}", what, why ? why : "unknown error"));
  }
  archive* a_;
  std::int64_t mtime_s_;
};

}  // namespace

export_summary write_run_archive(storage::journal& journal, const std::string& run_id, int fd) {
  // Read in this order, so that a run still running exports a consistent
  // prefix: its row first (its status then), the steps already there, the
  // events; a checkpoint or signal delivery committed with a later step
  // than those is left out with that step.
  const auto run = journal.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal.path().string()));
  if (!run->unreadable.empty())
    throw engine_error(errc::bad_request, fmt::format("run {} cannot be exported: {}", run_id, run->unreadable));
  const std::uint64_t steps_there = journal.step_count(run_id);
  std::vector<storage::event_record> events;
  for (auto& e : journal.events(run_id)) {
    const bool with_later_step = e.seq && *e.seq >= steps_there && (e.kind == checkpoint_event || e.kind == "signal_delivered");
    if (!with_later_step) events.push_back(std::move(e));
  }
  std::vector<storage::step_record> steps;
  for (std::uint64_t next = 0; next < steps_there;) {
    auto chunk = journal.steps_from(run_id, next, steps_there, 4 << 20);
    if (chunk.empty()) break;
    for (auto& s : chunk) {
      next = s.result.seq + 1;
      steps.push_back(std::move(s));
    }
  }
  auto signals = journal.signals(run_id);
  for (auto& s : signals)
    if (s.delivered_seq && *s.delivered_seq >= steps_there) s.delivered_seq.reset(), s.delivered_at_ms.reset();
  const auto state = journal.run_state(run_id);
  const auto digests = named_pieces(events);

  std::vector<std::pair<std::string, std::string>> rows = {
      {"run.json", dump(row(*run)) + "\n"},
      {"steps.jsonl", lines(steps)},
      {"events.jsonl", lines(events)},
      {"signals.jsonl", lines(signals)},
      {"run_state.json", dump(state ? *state : json()) + "\n"}};
  export_summary summary{steps.size(), events.size(), signals.size(), digests.size(), 0};
  json entries = json::array();
  for (const auto& [name, bytes] : rows) {
    entries.push_back({{"name", name}, {"size", bytes.size()}, {"sha256", sha256_hex(bytes)}});
    summary.bytes += bytes.size();
  }
  // The manifest comes first and names every piece's hash: each is read
  // twice (here, then to write it), one at a time.
  for (const auto& d : digests) {
    const auto b = journal.find_blob(d);
    if (!b) throw engine_error(errc::not_found, fmt::format("run {}: the workspace piece {} is missing from {}", run_id, d,
                                                            journal.path().string()));
    entries.push_back({{"name", piece_entry(d)}, {"size", b->data.size()}, {"sha256", sha256_hex(b->data)}});
    summary.bytes += b->data.size();
  }
  const std::int64_t now = storage::now_ms();
  const json manifest = {{"format", archive_format},
                         {"version", archive_version},
                         {"cairn", protocol::cairn_version()},
                         {"backend", journal.backend()},
                         {"run", run_id},
                         {"exported_at_ms", now},
                         {"counts",
                          {{"steps", summary.steps},
                           {"events", summary.events},
                           {"signals", summary.signals},
                           {"pieces", summary.pieces}}},
                         {"entries", entries}};
  tar_writer out(fd, now / 1000);
  out.add("manifest.json", dump(manifest) + "\n");
  for (const auto& [name, bytes] : rows) out.add(name, bytes);
  rows.clear();
  for (const auto& d : digests) {
    const auto b = journal.find_blob(d);
    if (!b) throw engine_error(errc::not_found, fmt::format("run {}: the workspace piece {} went while it was exported", run_id, d));
    out.add(piece_entry(d), b->data);
  }
  out.close();
  return summary;
}

piece_spool::piece_spool(const std::filesystem::path& folder)
    : fd_(::open(folder.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) {
  if (!fd_)
    throw std::runtime_error(fmt::format("import: cannot make a temporary file in {}: {}", folder.string(), std::strerror(errno)));
}

void piece_spool::add(const storage::blob& b) {
  if (places_.contains(b.digest)) return;
  for (std::size_t at = 0; at < b.data.size();) {
    const auto n = ::pwrite(fd_.get(), b.data.data() + at, b.data.size() - at, static_cast<off_t>(end_ + at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(fmt::format("import: cannot keep a piece in a temporary file: {}", std::strerror(errno)));
    at += static_cast<std::size_t>(n);
  }
  places_[b.digest] = {end_, b.size, b.data.size()};
  end_ += b.data.size();
}

std::optional<storage::blob> piece_spool::find(const std::string& digest) const {
  const auto it = places_.find(digest);
  if (it == places_.end()) return std::nullopt;
  storage::blob b{digest, it->second.size, std::string(it->second.stored, '\0')};
  for (std::size_t at = 0; at < b.data.size();) {
    const auto n = ::pread(fd_.get(), b.data.data() + at, b.data.size() - at, static_cast<off_t>(it->second.offset + at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("import: cannot read back a piece from its temporary file");
    at += static_cast<std::size_t>(n);
  }
  return b;
}

std::vector<std::string> piece_spool::digests() const {
  std::vector<std::string> out;
  for (const auto& [d, place] : places_) out.push_back(d);
  return out;
}

namespace {

// libarchive's reader on an fd, RAII: zstd-compressed tar and nothing else.
class tar_reader {
 public:
  explicit tar_reader(int fd) : a_(archive_read_new()) {
    if (!a_ || archive_read_support_filter_zstd(a_) != ARCHIVE_OK || archive_read_support_format_tar(a_) != ARCHIVE_OK)
      throw std::runtime_error("import: cannot start reading");
    if (archive_read_open_fd(a_, fd, io_block) != ARCHIVE_OK)
      fail("the archive cannot be read: it is truncated, damaged or no cairn export (a zstd-compressed tar)");
  }
  ~tar_reader() { archive_read_free(a_); }
  tar_reader(const tar_reader&) = delete;
  tar_reader& operator=(const tar_reader&) = delete;

  // The next entry's header; nullptr at the end.
  archive_entry* next() {
    archive_entry* e = nullptr;
    const int r = archive_read_next_header(a_, &e);
    if (r == ARCHIVE_EOF) return nullptr;
    if (r != ARCHIVE_OK) fail("the archive is truncated or damaged");
    return e;
  }
  // The entry's bytes, hashed; refused past `limit`.
  std::string read(const std::string& name, std::uint64_t limit, sha256& hash) {
    std::string out;
    char buffer[io_block];
    for (;;) {
      const auto n = archive_read_data(a_, buffer, sizeof buffer);
      if (n < 0) fail(fmt::format("{} is truncated or damaged", name));
      if (n == 0) return out;
      if (out.size() + static_cast<std::uint64_t>(n) > limit)
        refuse(fmt::format("import refused: {} holds more bytes than the manifest says", name));
      out.append(buffer, static_cast<std::size_t>(n));
      hash.add(buffer, static_cast<std::size_t>(n));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    const char* why = archive_error_string(a_);
    refuse(fmt::format("import refused: {} ({})", what, why ? why : "no detail"));
  }
  archive* a_;
};

template <class T, class F>
std::vector<T> parse_lines(const std::string& name, const std::string& text, F&& of) {
  std::vector<T> out;
  std::size_t line = 0;
  for (std::size_t at = 0; at < text.size();) {
    const auto end = text.find('\n', at);
    if (end == std::string::npos) refuse(fmt::format("import refused: {} does not end with a newline", name));
    ++line;
    try {
      out.push_back(of(protocol::parse_bounded(std::string_view(text).substr(at, end - at), name,
                                               {protocol::max_depth, end - at + 1})));
    } catch (const std::exception& e) {
      refuse(fmt::format("import refused: line {} of {} is not a row cairn writes: {}", line, name, e.what()));
    }
    at = end + 1;
  }
  return out;
}

// The rows, checked as the journal would have them: steps dense from 0,
// every event declared, checkpoints that fold (their paths under the
// workspace), signals delivered at steps there are.
void check_rows(const archived_run& a, const json& counts) {
  for (std::size_t i = 0; i < a.steps.size(); ++i)
    if (a.steps[i].result.seq != i)
      refuse(fmt::format("import refused: steps.jsonl holds step {} where step {} belongs", a.steps[i].result.seq, i));
  for (const auto& e : a.events) {
    const auto* d = declared_event(e.kind);
    if (!d) refuse(fmt::format("import refused: events.jsonl holds an event '{}' this cairn does not know", e.kind));
    if (d->at_step != e.seq.has_value())
      refuse(fmt::format("import refused: events.jsonl holds an event '{}' {}at a step", e.kind, d->at_step ? "not " : ""));
  }
  try {
    checkpoint_state(a.events, a.run.id);
  } catch (const std::exception& e) {
    refuse(fmt::format("import refused: {}", e.what()));
  }
  std::set<std::int64_t> ids;
  for (const auto& s : a.signals) {
    if (!ids.insert(s.id).second) refuse(fmt::format("import refused: signal {} appears twice", s.id));
    if (s.delivered_seq && *s.delivered_seq >= a.steps.size())
      refuse(fmt::format("import refused: signal {} was delivered at step {}, which the archive lacks", s.id,
                         *s.delivered_seq));
  }
  if (counts.value("steps", -1) != static_cast<std::int64_t>(a.steps.size()) ||
      counts.value("events", -1) != static_cast<std::int64_t>(a.events.size()) ||
      counts.value("signals", -1) != static_cast<std::int64_t>(a.signals.size()))
    refuse("import refused: the archive's rows are not as many as its manifest counts");
}

}  // namespace

archived_run read_run_archive(int fd, piece_spool& spool) {
  tar_reader in(fd);
  const auto entry_name = [](archive_entry* e) {
    const char* p = archive_entry_pathname(e);
    return p ? std::string(p) : std::string();
  };
  // Only a plain file is read: a link (hard or symbolic), device, fifo or
  // folder is refused for what it is, whatever its name.
  const auto plain_file = [&](archive_entry* e) {
    const std::string name = entry_name(e);
    if (archive_entry_hardlink(e) || archive_entry_filetype(e) != AE_IFREG)
      refuse(fmt::format("import refused: the archive's entry '{}' is not a plain file (a link, device, fifo or "
                         "folder); a cairn export holds none",
                         name));
    return name;
  };

  archive_entry* e = in.next();
  if (!e) refuse("import refused: the archive is empty");
  if (plain_file(e) != "manifest.json")
    refuse(fmt::format("import refused: the archive begins with '{}', not manifest.json: not a cairn export", entry_name(e)));
  if (archive_entry_size_is_set(e) && archive_entry_size(e) > static_cast<la_int64_t>(max_manifest))
    refuse("import refused: its manifest is larger than any cairn writes");
  archived_run out;
  {
    sha256 ignored;
    const std::string text = in.read("manifest.json", max_manifest, ignored);
    try {
      out.manifest = protocol::parse_bounded(text, "manifest.json", {protocol::max_depth, max_manifest});
    } catch (const std::exception& ex) {
      refuse(fmt::format("import refused: {}", ex.what()));
    }
  }
  const json& m = out.manifest;
  if (!m.is_object() || m.value("format", "") != archive_format)
    refuse("import refused: not a cairn export (its manifest names no format cairn-run-export)");
  if (!m.contains("version") || !m["version"].is_number_integer())
    refuse("import refused: its manifest says no format version");
  if (const auto v = m["version"].get<std::int64_t>(); v != archive_version)
    refuse(v > archive_version
               ? fmt::format("import refused: written by a newer cairn (format {}, cairn {}); this cairn reads format {}: "
                             "upgrade cairn to import it",
                             v, m.value("cairn", "?"), archive_version)
               : fmt::format("import refused: format {} is not one this cairn reads (format {})", v, archive_version));

  // What the manifest lists: the five rows in order, then pieces; sizes
  // summed within max_archive_bytes before any is read.
  struct expected {
    std::string name;
    std::uint64_t size;
    std::string sha256;
  };
  std::vector<expected> listed;
  std::uint64_t total = 0;
  const std::vector<std::string> row_names = {"run.json", "steps.jsonl", "events.jsonl", "signals.jsonl", "run_state.json"};
  try {
    for (const auto& x : m.at("entries")) {
      expected ex{x.at("name").get<std::string>(), x.at("size").get<std::uint64_t>(), x.at("sha256").get<std::string>()};
      const std::size_t i = listed.size();
      const bool row = i < row_names.size();
      if (row ? ex.name != row_names[i]
              : !(ex.name.starts_with("pieces/sha256-") && is_digest("sha256:" + ex.name.substr(14))))
        refuse(fmt::format("import refused: its manifest lists an entry '{}' a cairn export does not hold", ex.name));
      if (ex.size > (row ? max_json_entry : max_piece_entry))
        refuse(fmt::format("import refused: its manifest says {} holds {} bytes, more than cairn ever writes there",
                           ex.name, ex.size));
      total += ex.size;
      if (total > max_archive_bytes)
        refuse(fmt::format("import refused: the archive would unpack to more than {} GiB", max_archive_bytes >> 30));
      listed.push_back(std::move(ex));
    }
  } catch (const json::exception& ex) {
    refuse(fmt::format("import refused: its manifest cannot be read: {}", ex.what()));
  }
  if (listed.size() < row_names.size()) refuse("import refused: its manifest lists fewer entries than an export holds");

  std::set<std::string> expected_pieces;
  for (std::size_t i = 0;; ++i) {
    e = in.next();
    if (!e) {
      if (i < listed.size()) refuse(fmt::format("import refused: the archive is truncated: {} is missing", listed[i].name));
      break;
    }
    const std::string name = plain_file(e);
    if (i >= listed.size() || name != listed[i].name)
      refuse(fmt::format("import refused: the archive holds an entry '{}' its manifest does not list there", name));
    const auto& want = listed[i];
    if (archive_entry_size_is_set(e) && static_cast<std::uint64_t>(archive_entry_size(e)) != want.size)
      refuse(fmt::format("import refused: {} is not the size its manifest says", name));
    sha256 hash;
    std::string bytes = in.read(name, want.size, hash);
    if (bytes.size() != want.size) refuse(fmt::format("import refused: {} is truncated", name));
    if (hash.hex() != want.sha256)
      refuse(fmt::format("import refused: {} does not match its SHA-256 in the manifest: the archive was altered or "
                         "damaged",
                         name));
    try {
      if (name == "run.json") {
        out.run = run_of(protocol::parse_bounded(bytes, name, {protocol::max_depth, bytes.size() + 1}));
      } else if (name == "steps.jsonl") {
        out.steps = parse_lines<storage::step_record>(name, bytes, step_of);
      } else if (name == "events.jsonl") {
        out.events = parse_lines<storage::event_record>(name, bytes, event_of);
        expected_pieces = named_pieces(out.events);
      } else if (name == "signals.jsonl") {
        out.signals = parse_lines<storage::signal_record>(name, bytes, signal_of);
      } else if (name == "run_state.json") {
        json state = protocol::parse_bounded(bytes, name, {protocol::max_depth, bytes.size() + 1});
        if (!state.is_null()) out.state = std::move(state);
      } else {
        storage::blob b{"sha256:" + name.substr(14), 0, std::move(bytes)};
        if (!expected_pieces.contains(b.digest))
          refuse(fmt::format("import refused: {} is a piece no checkpoint of the run names", name));
        // Its size as its encoding says, checked (never allocated) before unpack_piece reads it.
        if (!b.data.empty() && b.data[0] == 'r') b.size = b.data.size() - 1;
        else if (!b.data.empty() && b.data[0] == 'z') b.size = ZSTD_getFrameContentSize(b.data.data() + 1, b.data.size() - 1);
        unpack_piece(b);
        spool.add(b);
      }
    } catch (const engine_error& ex) {
      if (ex.code() == errc::bad_request) throw;
      refuse(fmt::format("import refused: {}: {}", name, ex.what()));
    } catch (const std::exception& ex) {
      refuse(fmt::format("import refused: {} is not as cairn writes it: {}", name, ex.what()));
    }
  }
  for (const auto& d : expected_pieces)
    if (!spool.contains(d)) refuse(fmt::format("import refused: the workspace piece {} its checkpoints name is missing", d));
  if (m.value("run", "") != out.run.id) refuse("import refused: its manifest names another run than run.json holds");
  check_rows(out, m.value("counts", json::object()));
  for (auto& s : out.steps) s.run_id = out.run.id;
  return out;
}

}  // namespace cairn::engine
