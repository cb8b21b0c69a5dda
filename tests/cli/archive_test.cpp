// `cairn export` and `cairn import` as a user runs them: a run moved from
// SQLite to PostgreSQL and back keeps its steps, events and status byte for
// byte; an imported failed run is shown, forked and resumed on its files;
// and archives built as an attacker would (truncated, altered, hostile
// entries, a decompression bomb, a newer format) are refused with one line
// and exit code 2, the journal left exactly as it was.
#include <catch2/catch.hpp>

#include <archive.h>
#include <archive_entry.h>
#include <openssl/evp.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <SQLiteCpp/SQLiteCpp.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/support/pg_cluster.hpp"
#include "tests/temp_dir.hpp"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct fixture {
  cairn::testing::temp_dir dir;

  // `cairn ARGS` with CAIRN_HOME `home` (under dir) and, when given, --db.
  cairn::testing::cli_result cli(const std::string& home, std::vector<std::string> args, const std::string& db = "") const {
    if (!db.empty()) args.insert(args.end(), {"--db", db});
    return cairn::testing::run_program(CAIRN_BIN, std::move(args), dir.path(),
                                       {.env = {{"CAIRN_HOME", (dir / home).string()}}});
  }
  fs::path file(const std::string& name) const { return dir / name; }

  // Run `id` of step_agent in home "a": `steps` steps, the last one failing
  // for good when `fail` is set.
  void make_run(const std::string& id, int steps, bool fail) const {
    json input = {{"steps", steps}};
    if (fail) input["terminal_at"] = steps - 1;
    auto r = cli("a", {"run", STEP_AGENT, "--id", id, "--input", input.dump()});
    INFO(r.out << r.err);
    REQUIRE(r.code == (fail ? 1 : 0));
  }
  void export_run(const std::string& home, const std::string& id, const std::string& to, const std::string& db = "") const {
    auto r = cli(home, {"export", id, "-o", file(to).string()}, db);
    INFO(r.err);
    REQUIRE(r.code == 0);
  }
  cairn::testing::cli_result import_run(const std::string& home, const std::string& from, std::vector<std::string> more = {},
                                        const std::string& db = "") const {
    std::vector<std::string> args = {"import", file(from).string()};
    args.insert(args.end(), more.begin(), more.end());
    return cli(home, args, db);
  }
};

// What a run's journal holds that an import must keep: its status, output
// and error, its steps as stored, its events (kind, seq, data) but the
// first `skip` (the imported events an import adds before them).
json journal_of(const std::string& db, const std::string& id, std::size_t skip = 0) {
  auto j = cairn::storage::open_journal(db, {.read_only = true});
  const auto run = j->find_run(id);
  REQUIRE(run);
  json out = {{"status", cairn::storage::to_string(run->status)}, {"output", run->output}, {"input", run->input}};
  if (run->error) out["error"] = {run->error->message, run->error->type};
  for (const auto& s : j->steps(id))
    out["steps"].push_back({cairn::protocol::to_json(s.result), s.started_at_ms, s.finished_at_ms});
  const auto events = j->events(id);
  for (std::size_t i = skip; i < events.size(); ++i)
    out["events"].push_back({events[i].kind, events[i].seq ? json(*events[i].seq) : json(), events[i].data});
  return out;
}

// Every row of every table of a SQLite journal, as text: what "changes
// nothing" is held to.
std::string dump_sqlite(const fs::path& db) {
  SQLite::Database d(db.string(), SQLite::OPEN_READONLY);
  std::string out;
  SQLite::Statement tables(d, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
  while (tables.executeStep()) {
    const std::string t = tables.getColumn(0).getString();
    out += "table " + t + "\n";
    SQLite::Statement rows(d, "SELECT * FROM \"" + t + "\"");
    while (rows.executeStep()) {
      for (int i = 0; i < rows.getColumnCount(); ++i) out += rows.getColumn(i).getString() + "|";
      out += "\n";
    }
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

// An archive's entry as the test builds it: a plain file unless `type` says
// otherwise; `declared` is the size its header says (default: its bytes').
struct entry {
  std::string name, bytes;
  unsigned type = AE_IFREG;
  std::string link;  // for a symlink or hardlink
  std::optional<std::int64_t> declared;
};

std::vector<entry> read_entries(const fs::path& file) {
  archive* a = archive_read_new();
  archive_read_support_filter_zstd(a);
  archive_read_support_format_tar(a);
  REQUIRE(archive_read_open_filename(a, file.c_str(), 1 << 16) == ARCHIVE_OK);
  std::vector<entry> out;
  archive_entry* e = nullptr;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    entry x;
    x.name = archive_entry_pathname(e);
    char buffer[1 << 16];
    for (la_ssize_t n; (n = archive_read_data(a, buffer, sizeof buffer)) > 0;) x.bytes.append(buffer, n);
    out.push_back(std::move(x));
  }
  archive_read_free(a);
  return out;
}

// Writes `entries` as a zstd-compressed tar. An entry whose declared size
// exceeds its bytes is padded with zeros up to it (compressed, it costs
// almost nothing: a bomb).
void write_entries(const fs::path& file, const std::vector<entry>& entries) {
  archive* a = archive_write_new();
  archive_write_add_filter_zstd(a);
  archive_write_set_format_pax_restricted(a);
  REQUIRE(archive_write_open_filename(a, file.c_str()) == ARCHIVE_OK);
  for (const auto& x : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, x.name.c_str());
    archive_entry_set_filetype(e, x.type);
    archive_entry_set_perm(e, 0644);
    if (x.type == AE_IFLNK) archive_entry_set_symlink(e, x.link.c_str());
    if (x.type == AE_IFCHR) archive_entry_set_rdev(e, makedev(1, 3));
    if (x.type == AE_IFREG && !x.link.empty()) archive_entry_set_hardlink(e, x.link.c_str());
    const std::int64_t size = x.type == AE_IFREG && x.link.empty() ? x.declared.value_or(x.bytes.size()) : 0;
    archive_entry_set_size(e, size);
    REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
    archive_write_data(a, x.bytes.data(), std::min<std::size_t>(x.bytes.size(), size));
    const std::string zeros(1 << 20, '\0');
    for (std::int64_t left = size - static_cast<std::int64_t>(x.bytes.size()); left > 0; left -= zeros.size())
      archive_write_data(a, zeros.data(), std::min<std::int64_t>(left, zeros.size()));
    archive_entry_free(e);
  }
  REQUIRE(archive_write_close(a) == ARCHIVE_OK);
  archive_write_free(a);
}

entry& named(std::vector<entry>& entries, std::string_view prefix) {
  for (auto& e : entries)
    if (e.name.starts_with(prefix)) return e;
  FAIL("no entry " << prefix);
  throw;
}

// The manifest rewritten so that `name`'s listed size and hash are its bytes'
// (what an attacker who edits an entry does).
void relist(std::vector<entry>& entries, const std::string& name) {
  json m = json::parse(named(entries, "manifest.json").bytes);
  for (auto& x : m["entries"])
    if (x["name"] == name) {
      x["size"] = named(entries, name).bytes.size();
      x["sha256"] = sha256_hex(named(entries, name).bytes);
    }
  named(entries, "manifest.json").bytes = m.dump() + "\n";
}

}  // namespace

TEST_CASE("a run exported from SQLite, imported into PostgreSQL and back keeps its journal byte for byte") {
  fixture f;
  f.make_run("orig", 8, true);
  f.export_run("a", "orig", "orig.tar.zst");

  auto& cluster = cairn::testing::shared_pg_cluster();
  const std::string pg = cluster.fresh_database();
  auto in = f.import_run("b", "orig.tar.zst", {"--json"}, pg);
  INFO(in.out << in.err);
  REQUIRE(in.code == 0);
  CHECK(json::parse(in.out)["status"] == "failed");
  CHECK(json::parse(in.out)["workspace_restored"] == true);
  const std::string sqlite_a = (f.dir / "a" / "cairn.db").string();
  const json original = journal_of(sqlite_a, "orig");
  CHECK(journal_of(pg, "orig", 1) == original);
  {
    auto j = cairn::storage::open_journal(pg, {.read_only = true});
    const auto first = j->events("orig").front();
    CHECK(first.kind == "imported");
    CHECK(first.data["from_run"] == "orig");
    CHECK(first.data["backend"] == "sqlite");
  }

  f.export_run("b", "orig", "back.tar.zst", pg);
  auto back = f.import_run("c", "back.tar.zst", {"--id", "again"});
  INFO(back.out << back.err);
  REQUIRE(back.code == 0);
  CHECK(back.out == "again\n");
  const json again = journal_of((f.dir / "c" / "cairn.db").string(), "again", 2);
  CHECK(again == original);
  // Its workspace is the original's last checkpoint: what the agent had written when it failed.
  CHECK(cairn::testing::slurp(f.dir / "c" / "workspaces" / "again" / "exec.log") ==
        cairn::testing::slurp(f.dir / "a" / "workspaces" / "orig" / "exec.log"));
}

TEST_CASE("an imported failed run is shown, forked and resumed on the files it had") {
  fixture f;
  f.make_run("orig", 8, true);  // steps 0-6 ok, 7 journaled as failed for good
  // To stdout (libarchive pads there unless told not to: zstd -t would refuse the padding).
  auto out = cairn::testing::run_program(
      "/bin/sh", {"-c", fmt::format("'{0}' export orig > '{1}' && zstd -q -t '{1}'", CAIRN_BIN, f.file("orig.tar.zst").string())},
      f.dir.path(), {.env = {{"CAIRN_HOME", (f.dir / "a").string()}}});
  INFO(out.err);
  REQUIRE(out.code == 0);
  // From stdin, into a journal of its own, under the default sandbox.
  auto in = cairn::testing::run_program(
      "/bin/sh", {"-c", fmt::format("'{}' import - < '{}'", CAIRN_BIN, f.file("orig.tar.zst").string())}, f.dir.path(),
      {.env = {{"CAIRN_HOME", (f.dir / "b").string()}}});
  INFO(in.out << in.err);
  REQUIRE(in.code == 0);
  CHECK(in.out == "orig\n");
  CHECK_THAT(in.err, Catch::Contains("imported run orig as failed: 8 steps"));

  auto show = f.cli("b", {"show", "orig"});
  CHECK(show.code == 0);
  CHECK_THAT(show.out, Catch::Contains("imported"));
  for (const std::string at : {"0", "3", "7"}) {
    auto there = f.cli("a", {"workspace", "orig", "--at", at, "exec.log"});
    auto here = f.cli("b", {"workspace", "orig", "--at", at, "exec.log"});
    INFO(at << here.err);
    REQUIRE(here.code == 0);
    CHECK(here.out == there.out);
  }

  // Forked at 4 with the failing step gone, then resumed: steps 0-4 are the
  // original's (not executed again), 5-9 new.
  auto fork = f.cli("b", {"fork", "orig", "--at", "4", "--id", "fixed", "--input", R"({"steps":10})", "--detach"});
  INFO(fork.out << fork.err);
  REQUIRE(fork.code == 0);
  auto done = f.cli("b", {"resume", "fixed", "--json"});
  INFO(done.out << done.err);
  REQUIRE(done.code == 0);
  const std::string log = cairn::testing::slurp(f.dir / "b" / "workspaces" / "fixed" / "exec.log");
  const auto original_at_4 = f.cli("a", {"workspace", "orig", "--at", "4", "exec.log"}).out;
  REQUIRE(!original_at_4.empty());
  CHECK(log.starts_with(original_at_4));
  CHECK(std::count(log.begin(), log.end(), '\n') == 10);

  // The imported run itself resumes: it replays its journal, step 7's
  // failure included, and ends failed again without executing any step.
  auto resumed = f.cli("b", {"resume", "orig"});
  INFO(resumed.out << resumed.err);
  CHECK(resumed.code == 1);
  CHECK(cairn::testing::slurp(f.dir / "b" / "workspaces" / "orig" / "exec.log") ==
        cairn::testing::slurp(f.dir / "a" / "workspaces" / "orig" / "exec.log"));
}

TEST_CASE("archives an attacker builds are refused with one line, and the journal is left as it was") {
  fixture f;
  f.make_run("orig", 4, false);
  f.export_run("a", "orig", "orig.tar.zst");
  // The journal imports go into holds one run already (a run of its own).
  f.make_run("other", 2, false);
  const fs::path db = f.dir / "a" / "cairn.db";
  const auto good = read_entries(f.file("orig.tar.zst"));
  REQUIRE(good.size() > 6);  // the manifest, five rows, pieces

  const auto refused = [&](const std::string& name, const std::vector<std::string>& more, const std::string& says) {
    const std::string before = dump_sqlite(db);
    const auto workspaces = std::distance(fs::directory_iterator(f.dir / "a" / "workspaces"), fs::directory_iterator());
    auto r = f.import_run("a", name, more);
    INFO(name << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(says));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
    CHECK(dump_sqlite(db) == before);
    CHECK(std::distance(fs::directory_iterator(f.dir / "a" / "workspaces"), fs::directory_iterator()) == workspaces);
  };
  const auto build = [&](const std::string& name, const std::vector<entry>& entries) {
    write_entries(f.file(name), entries);
    return name;
  };

  SECTION("truncated") {
    const std::string bytes = cairn::testing::slurp(f.file("orig.tar.zst"));
    std::ofstream(f.file("cut.tar.zst"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    refused("cut.tar.zst", {"--id", "x"}, "truncated");
    // Every entry there, but the last piece's end gone.
    auto entries = good;
    entries.back().bytes.resize(entries.back().bytes.size() / 2);
    entries.back().declared = entries.back().bytes.size();
    refused(build("short.tar.zst", entries), {"--id", "x"}, "not the size its manifest says");
  }
  SECTION("an entry altered: its hash, or a piece re-hashed in the manifest but not its digest") {
    auto entries = good;
    named(entries, "steps.jsonl").bytes[10] ^= 1;
    refused(build("tampered.tar.zst", entries), {"--id", "x"}, "steps.jsonl does not match its SHA-256");
    entries = good;
    auto& piece = named(entries, "pieces/");
    piece.bytes = "r" + std::string("not what the digest says");
    relist(entries, piece.name);
    refused(build("piece.tar.zst", entries), {"--id", "x"}, "does not match its digest");
  }
  SECTION("names: '..', absolute, unexpected") {
    for (const std::string bad : {"../run.json", "/etc/run.json", "run.json/../../x", "extra.txt"}) {
      auto entries = good;
      named(entries, "run.json").name = bad;
      refused(build("name.tar.zst", entries), {"--id", "x"}, "its manifest does not list there");
    }
    auto entries = good;
    json m = json::parse(entries[0].bytes);
    m["entries"][1]["name"] = "../../etc/passwd";
    entries[0].bytes = m.dump();
    refused(build("listed.tar.zst", entries), {"--id", "x"}, "lists an entry '../../etc/passwd'");
  }
  SECTION("links, devices, fifos and folders") {
    for (const unsigned type : {AE_IFLNK, AE_IFCHR, AE_IFIFO, AE_IFDIR}) {
      auto entries = good;
      auto& e = named(entries, "steps.jsonl");
      e.type = type;
      e.link = "/etc/passwd";
      e.bytes.clear();
      refused(build("special.tar.zst", entries), {"--id", "x"}, "is not a plain file");
    }
    auto entries = good;
    named(entries, "steps.jsonl").link = "run.json";  // a hard link
    refused(build("hard.tar.zst", entries), {"--id", "x"}, "is not a plain file");
  }
  SECTION("a decompression bomb") {
    // Declared: the manifest says more than an import unpacks.
    auto entries = good;
    json m = json::parse(entries[0].bytes);
    for (int i = 0; i < 5; ++i) m["entries"][i]["size"] = std::uint64_t{1} << 30;  // each row as large as may be: 5 GiB
    entries[0].bytes = m.dump();
    refused(build("declared.tar.zst", entries), {"--id", "x"}, "would unpack to more than 4 GiB");
    // Actual: 256 MiB of zeros (a few hundred compressed bytes) where the manifest says a few.
    entries = good;
    named(entries, "steps.jsonl").declared = std::int64_t{256} << 20;
    refused(build("bomb.tar.zst", entries), {"--id", "x"}, "not the size its manifest says");
    CHECK(fs::file_size(f.file("bomb.tar.zst")) < (1 << 20));
  }
  SECTION("a newer format, or no cairn export at all") {
    auto entries = good;
    json m = json::parse(entries[0].bytes);
    m["version"] = 2;
    entries[0].bytes = m.dump();
    refused(build("newer.tar.zst", entries), {"--id", "x"}, "written by a newer cairn (format 2");
    refused(build("newer.tar.zst", entries), {"--id", "x"}, "this cairn reads format 1");
    std::ofstream(f.file("noise"), std::ios::binary) << std::string(4096, 'x');
    refused("noise", {"--id", "x"}, "no cairn export");
  }
  SECTION("an id that exists, or one that cannot be") {
    refused("orig.tar.zst", {}, "run orig exists already");
    refused("orig.tar.zst", {}, "--id NEW");
    refused("orig.tar.zst", {"--id", "../up"}, "run id");
  }
}

TEST_CASE("cairn export of an unknown run fails and leaves no file") {
  fixture f;
  f.make_run("orig", 2, false);
  auto none = f.cli("a", {"export", "nope", "-o", f.file("x").string()});
  CHECK(none.code == 2);
  CHECK_THAT(none.err, Catch::Contains("no run 'nope'"));
  CHECK_FALSE(fs::exists(f.file("x")));
}
