// A retention pass's pacing (engine/retention.hpp pause_after) and what
// remove_runs leaves behind, whether its transactions are synced or not.
#include <catch2/catch.hpp>

#include <fstream>

#include "engine/retention.hpp"
#include "engine/run_paths.hpp"
#include "tests/storage/journal_samples.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;

TEST_CASE("pause_after: alone, the floor; while others write, at most the share of the time, and the floor at least") {
  engine::retention_pacing pacing;
  pacing.pause = 2ms;
  pacing.share = 0.1;
  CHECK(engine::pause_after(pacing, 5000us, false) == 2ms);
  CHECK(engine::pause_after(pacing, 5000us, true) == 45000us);  // 5 ms of every 50
  CHECK(engine::pause_after(pacing, 100us, true) == 2ms);
  pacing.share = 0.5;
  CHECK(engine::pause_after(pacing, 5000us, true) == 5000us);
  pacing.share = 1;  // no limit
  CHECK(engine::pause_after(pacing, 5000us, true) == 2ms);
}

TEST_CASE("remove_runs removes each run's rows and log, synced at every transaction or only at the last") {
  const auto sync_every = GENERATE(0ms, 1h);
  INFO("sync_every " << sync_every.count() << " ms");
  testing::temp_dir dir;
  const auto& home = dir.path();
  auto journal = storage::open_journal(home / "cairn.db");
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    const auto id = "r" + std::to_string(i);
    journal->create_run(storage::samples::a_run(id));
    journal->append_step(storage::samples::ok_step(id, 0, {{"n", i}}));
    journal->finish_run(id, storage::run_status::completed, nullptr, std::nullopt);
    std::filesystem::create_directories(engine::run_log(home, id).parent_path());
    std::ofstream(engine::run_log(home, id)) << "log of " << id << "\n";
    ids.push_back(id);
  }
  journal->create_run(storage::samples::a_run("live"));
  ids.insert(ids.begin() + 9, "live");  // refused, alone in its transaction's group
  engine::retention_pacing pacing;
  pacing.runs_per_transaction = 3;
  pacing.pause = 0ms;
  pacing.sync_every = sync_every;
  const auto report = engine::remove_runs(*journal, {home, {}}, ids, pacing);
  CHECK(report.removed.size() == 20);
  REQUIRE(report.refused.size() == 1);
  CHECK(report.refused[0].first == "live");
  for (int i = 0; i < 20; ++i) {
    const auto id = "r" + std::to_string(i);
    CHECK_FALSE(journal->find_run(id));
    CHECK_FALSE(std::filesystem::exists(engine::run_log(home, id)));
  }
  CHECK(journal->find_run("live"));
  CHECK(report.file_bytes > 0);
}
