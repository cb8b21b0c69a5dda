// Workspace checkpoints (engine/workspace_checkpoints.hpp) on a real folder
// and the in-memory journal: what a step's checkpoint stores is what the
// agent changed, the journal's checkpoints fold to the files as they were,
// a crashed attempt's half-written files roll back, pieces are shared and
// go with the last run that uses them, and nothing the agent planted (a
// link, a fifo, a name) makes the host read or write outside the workspace.
#include "engine/workspace_checkpoints.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "engine/effects.hpp"
#include "engine/ledger.hpp"
#include "storage/memory/memory_journal.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace cairn::engine;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every entry under `root`: "d" for a folder, "l:TARGET" for a link, "f MODE:BYTES" for a file.
std::map<std::string, std::string> files_of(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const auto rel = it->path().lexically_relative(root).string();  // fs::relative would follow a link
    const auto st = it->symlink_status();
    if (fs::is_symlink(st)) out[rel] = "l:" + fs::read_symlink(it->path()).string();
    else if (fs::is_directory(st)) out[rel] = "d";
    else if (fs::is_regular_file(st))
      out[rel] = fmt::format("f {:o}:", static_cast<unsigned>(st.permissions()) & 07777) + read(it->path());
    else out[rel] = "other";
  }
  return out;
}

storage::step_record a_step(const std::string& run, std::uint64_t seq) {
  storage::step_record s;
  s.run_id = run;
  s.result.seq = seq;
  s.result.name = "s" + std::to_string(seq);
  s.result.kind = protocol::step_kind::step;
  s.result.ok = true;
  s.result.output = seq;
  return s;
}

// A run on an in-memory journal whose steps commit with their checkpoints, through the ledger.
struct journaled_run {
  std::string id;
  storage::memory::database db;
  ledger writes{db.open()};
  std::unique_ptr<storage::journal> reads = db.open();
  std::uint64_t next_seq = 0;

  explicit journaled_run(std::string run_id = "r") : id(std::move(run_id)) { add_run(id); }
  void add_run(const std::string& run) {
    writes.create_run({.id = run, .agent = "/agent", .sandbox = "none", .workspace = "/w/" + run});
    REQUIRE(writes.claim_run(run, "", "me"));
  }
  // Commits the next step with what `c` took; the data it stored.
  std::optional<json> step(workspace_checkpointer& c) {
    auto taken = c.take();
    std::optional<json> data;
    if (taken) data = taken->data;
    writes.apply(id, {effects::step_committed{a_step(id, next_seq++), std::nullopt, 0, std::move(taken)}});
    return data;
  }
  std::unique_ptr<workspace_checkpointer> watch(const fs::path& folder, bool roll_back = false,
                                                std::uint64_t budget = 1ull << 30) {
    return std::make_unique<workspace_checkpointer>(pieces_of(*reads), folder, checkpoint_state(*reads, id), roll_back, budget,
                                                    checkpoint_bytes(*reads, id));
  }
  // The files the journal's checkpoints hold after step `seq`, written out.
  std::map<std::string, std::string> at(std::uint64_t seq, const fs::path& scratch) {
    fs::remove_all(scratch);
    materialize(*reads, checkpoint_state(*reads, id, seq), scratch);
    return files_of(scratch);
  }
};

std::vector<std::string> keys(const json& files) {
  std::vector<std::string> out;
  for (const auto& [k, v] : files.items()) out.push_back(k);
  return out;
}

}  // namespace

TEST_CASE("a step's checkpoint stores what changed since the last, and the journal gives the files back") {
  testing::temp_dir t;
  const auto ws = t / "ws";
  write(ws / "input.txt", "given before the run");
  journaled_run run;
  auto c = run.watch(ws);

  // The first step stores what the workspace held before it.
  write(ws / "notes.md", "step 0");
  auto d0 = run.step(*c);
  REQUIRE(d0);
  CHECK(keys((*d0)["files"]) == std::vector<std::string>{"input.txt", "notes.md"});
  const auto after0 = files_of(ws);

  // One file changed among many: only it is stored.
  for (int i = 0; i < 50; ++i) write(ws / "data" / fmt::format("f{}.txt", i), std::string(100, 'a' + i % 26));
  run.step(*c);
  write(ws / "data" / "f7.txt", "rewritten");
  auto d2 = run.step(*c);
  REQUIRE(d2);
  CHECK(keys((*d2)["files"]) == std::vector<std::string>{"data/f7.txt"});
  CHECK((*d2)["removed"].empty());

  // Folders made deep at once, a folder renamed, one removed, a link: all seen.
  fs::create_directories(ws / "a" / "b" / "c");
  write(ws / "a" / "b" / "c" / "deep.txt", "deep");
  fs::rename(ws / "data", ws / "moved");
  fs::remove(ws / "notes.md");
  fs::create_symlink("/etc/passwd", ws / "link");
  ::chmod((ws / "input.txt").c_str(), 0600);
  auto d3 = run.step(*c);
  REQUIRE(d3);
  CHECK((*d3)["removed"] == json::array({"data", "notes.md"}));
  CHECK((*d3)["files"]["link"]["t"] == "l");
  CHECK((*d3)["files"]["link"]["to"] == "/etc/passwd");
  CHECK((*d3)["files"]["a/b/c/deep.txt"]["t"] == "f");
  CHECK((*d3)["files"]["moved/f7.txt"]["t"] == "f");
  CHECK((*d3)["files"]["input.txt"]["m"] == 0600);

  // Nothing changed: no checkpoint.
  CHECK_FALSE(run.step(*c));

  // The journal folds to the files of each step, byte for byte.
  CHECK(run.at(0, t / "at0") == after0);
  CHECK(run.at(4, t / "at4") == files_of(ws));
  CHECK(run.at(3, t / "at3") == files_of(ws));
  const auto at3 = files_of(t / "at3");
  REQUIRE(at3.contains("link"));
  CHECK(at3.at("link") == "l:/etc/passwd");
}

TEST_CASE("a file of several pieces is stored by piece, and an unchanged piece is not stored again") {
  testing::temp_dir t;
  const auto ws = t / "ws";
  std::string big(3 * (1 << 20) + 5, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + (i / 4096) % 26);
  write(ws / "big.bin", big);
  journaled_run run;
  auto c = run.watch(ws);
  auto d0 = run.step(*c);
  REQUIRE(d0);
  CHECK((*d0)["files"]["big.bin"]["p"].size() == 4);
  big[3 * (1 << 20) + 1] = '!';  // only the last piece changes
  write(ws / "big.bin", big);
  auto d1 = run.step(*c);
  REQUIRE(d1);
  CHECK((*d1)["files"]["big.bin"]["p"][0] == (*d0)["files"]["big.bin"]["p"][0]);
  CHECK((*d1)["bytes"].get<std::uint64_t>() < 100);  // one small piece, compressed
  CHECK(run.at(1, t / "at1").at("big.bin") == "f 644:" + big);
}

TEST_CASE("after a crash mid-step, the next attempt's workspace is the one the last committed step left") {
  testing::temp_dir t;
  const auto ws = t / "ws";
  journaled_run run;
  {
    fs::create_directories(ws);
    auto c = run.watch(ws);
    write(ws / "kept.txt", "committed");
    write(ws / "dir" / "inner.txt", "committed too");
    fs::create_symlink("kept.txt", ws / "alias");
    run.step(*c);
  }
  const auto committed = files_of(ws);
  // The attempt that died: half a rewrite, a new file, a removal, a folder where a file was.
  write(ws / "kept.txt", "half wri");
  write(ws / "junk.tmp", "never committed");
  fs::remove_all(ws / "dir");
  fs::remove(ws / "alias");
  fs::create_directories(ws / "alias" / "sub");
  write(ws / "alias" / "sub" / "x", "x");

  auto c = run.watch(ws, /*roll_back=*/true);
  CHECK(c->rolled_back() > 0);
  CHECK(files_of(ws) == committed);
  // What the roll-back wrote is no change of the agent's.
  CHECK_FALSE(run.step(*c));

  SECTION("without a crash, what the attempt before wrote after its last step is kept and stored") {
    write(ws / "after.txt", "written after the last step, then suspended");
    auto again = run.watch(ws, /*roll_back=*/false);
    CHECK(again->rolled_back() == 0);
    auto d = run.step(*again);
    REQUIRE(d);
    CHECK(keys((*d)["files"]) == std::vector<std::string>{"after.txt"});
  }
}

TEST_CASE("nothing an agent plants makes a checkpoint read or write outside its workspace, or block") {
  testing::temp_dir t;
  const auto ws = t / "ws";
  write(t / "outside" / "secret.txt", "host secret");
  fs::create_directories(ws);
  journaled_run run;
  auto c = run.watch(ws);
  // A link to a folder outside, and files "inside" it; a fifo nobody writes.
  fs::create_directory_symlink(t / "outside", ws / "door");
  REQUIRE(::mkfifo((ws / "pipe").c_str(), 0600) == 0);
  write(ws / "plain.txt", "plain");
  auto d = run.step(*c);
  REQUIRE(d);
  CHECK((*d)["files"]["door"]["t"] == "l");
  CHECK_FALSE((*d)["files"].contains("door/secret.txt"));
  CHECK_FALSE((*d)["files"].contains("pipe"));  // a fifo is not kept, and was never opened for reading
  for (const auto& [path, entry] : (*d)["files"].items()) {
    const json pieces = entry.value("p", json::array());
    for (const auto& digest : pieces)
      CHECK(run.reads->find_blob(digest.get<std::string>())->size != std::string("host secret").size());
  }

  // A roll-back never writes through a link the agent put where a folder was.
  const auto committed = files_of(ws);
  fs::remove(ws / "plain.txt");
  fs::create_directories(ws / "sub");
  write(ws / "sub" / "f", "committed");
  run.step(*c);
  fs::remove_all(ws / "sub");
  fs::create_directory_symlink(t / "outside", ws / "sub");  // the crashed attempt's last act
  auto r = run.watch(ws, /*roll_back=*/true);
  CHECK(fs::is_directory(fs::symlink_status(ws / "sub")));
  CHECK(read(ws / "sub" / "f") == "committed");
  CHECK_FALSE(fs::exists(t / "outside" / "f"));
  CHECK(read(t / "outside" / "secret.txt") == "host secret");
}

TEST_CASE("checkpoint data naming a path out of the workspace is refused, and a tampered piece is not written") {
  testing::temp_dir t;
  journaled_run run;
  workspace_state state;
  SECTION("a path with ..") {
    REQUIRE_THROWS(apply_checkpoint(state, {{"files", {{"../escape", {{"t", "d"}, {"m", 0700}}}}}}));
    REQUIRE_THROWS(apply_checkpoint(state, {{"files", {{"/abs", {{"t", "d"}, {"m", 0700}}}}}}));
  }
  SECTION("a piece whose bytes do not match its digest") {
    const std::string digest = "sha256:" + std::string(64, '0');
    const storage::blob forged{digest, 5, "rhello"};
    run.reads->put_blobs("r", std::span(&forged, 1), std::vector<std::string>{digest});
    state["f.txt"] = {'f', 0644, 5, 0, {digest}, ""};
    REQUIRE_THROWS_WITH(materialize(*run.reads, state, t / "out"), Catch::Contains("does not match its digest"));
    CHECK_FALSE(fs::exists(t / "out" / "f.txt"));
  }
}

TEST_CASE("pieces are shared across runs and go with the last run that uses them") {
  testing::temp_dir t;
  journaled_run run("a");
  run.add_run("b");
  write(t / "wa" / "same.txt", "the same bytes in two runs");
  write(t / "wb" / "same.txt", "the same bytes in two runs");
  auto ca = run.watch(t / "wa");
  auto da = run.step(*ca);
  run.id = "b";
  run.next_seq = 0;
  auto cb = run.watch(t / "wb");
  auto db = run.step(*cb);
  const std::string digest = (*da)["files"]["same.txt"]["p"][0];
  CHECK((*db)["files"]["same.txt"]["p"][0] == digest);
  for (const char* id : {"a", "b"})
    run.writes.apply(id, {effects::run_ended{storage::run_status::completed, nullptr, std::nullopt}});
  run.reads->delete_run("a");
  CHECK(run.reads->find_blob(digest));
  run.reads->delete_run("b");
  CHECK_FALSE(run.reads->find_blob(digest));
}

TEST_CASE("the checkpoints of a run stay within limits.checkpoint_mb") {
  testing::temp_dir t;
  journaled_run run;
  std::string noise(2 << 20, '\0');
  std::uint64_t x = 88172645463325252ull;
  for (auto& ch : noise) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ch = static_cast<char>(x);
  }
  fs::create_directories(t / "ws");
  auto c = run.watch(t / "ws", false, /*budget=*/1 << 20);
  write(t / "ws" / "noise.bin", noise);  // 2 MiB that do not compress
  REQUIRE_THROWS_AS(c->take(), budget_exceeded);
}
