#include "engine/run_journal.hpp"

#include <fmt/format.h>

#include "engine/run_id.hpp"
#include "engine/run_paths.hpp"
#include "engine/run_state.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/workspace_checkpoints.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::engine {
namespace {

struct run_tree {
  std::string root;
  std::uint64_t depth = 0;  // of the run: the root is 0
  std::uint64_t size = 0;   // runs in the tree, the root included
};

// The tree the run belongs to, through the journal's parent links.
run_tree tree_of(storage::journal& journal, const std::string& run_id) {
  run_tree tree{run_id, 0, 0};
  auto run = journal.find_run(run_id);
  for (std::string parent = run ? run->parent_id : ""; !parent.empty(); ++tree.depth) {
    tree.root = parent;
    auto up = journal.find_run(parent);
    parent = up ? up->parent_id : "";
  }
  std::vector<std::string> todo{tree.root};
  while (!todo.empty()) {
    auto id = std::move(todo.back());
    todo.pop_back();
    ++tree.size;
    for (auto& child : journal.children(id)) todo.push_back(std::move(child.id));
  }
  return tree;
}

// What the agent causes the host to store counts against its journal
// limits; the host's own few records per attempt (warnings, cancel_sent,
// limit_exceeded, the run's transitions) are counted from the next attempt.
bool charged(const effect& e) {
  return std::holds_alternative<effects::retry_due>(e) || std::holds_alternative<effects::tool_started>(e) ||
         std::holds_alternative<effects::timer_set>(e) || std::holds_alternative<effects::wait_started>(e);
}

}  // namespace

run_journal::run_journal(ledger& writes, storage::journal& reads, const std::filesystem::path& home,
                         const std::string& run_id, const journal_limits& limits)
    : writes_(writes), reads_(reads), home_(home), run_id_(run_id), budget_(reads, run_id, limits) {}

task<void> run_journal::apply(effect e) {
  if (auto* step = std::get_if<effects::step_committed>(&e)) {
    budget_.charge_step(step->record.result);
    // Its checkpoint's list of files is journal bytes too (its pieces are limits.checkpoint_mb's).
    if (step->checkpoint) budget_.charge_event(checkpoint_event, step->checkpoint->data);
    step->tokens = tokens_of_step(step->record.result);
  } else if (auto* baseline = std::get_if<effects::workspace_baseline>(&e)) {
    budget_.charge_event(baseline_event, baseline->checkpoint.data);
  } else if (charged(e))
    if (auto row = ledger::event_of(e)) budget_.charge_event(row->kind, row->data);
  co_await writes_.apply_async(run_id_, std::move(e));
}

namespace {

class checkpoint_keeper final : public workspace_keeper {
 public:
  explicit checkpoint_keeper(std::unique_ptr<workspace_checkpointer> c) : c_(std::move(c)) {}
  std::optional<workspace_checkpoint> take() override { return c_->take(); }

 private:
  std::unique_ptr<workspace_checkpointer> c_;
};

// The run's folder, watched.
opened_workspace open_folder(workspace_opening o) {
  auto c = std::make_unique<workspace_checkpointer>(o.pieces, o.run.workspace, std::move(o.state), o.roll_back,
                                                    o.budget_bytes, o.spent_bytes);
  const auto rolled_back = c->rolled_back();
  return {std::make_unique<checkpoint_keeper>(std::move(c)), rolled_back};
}

}  // namespace

task<workspace_watch> run_journal::watch_workspace(const storage::run_record& run, const policy& p) {
  workspace_watch watch;
  if (p.journal.checkpoint_bytes == 0 || run.workspace.empty()) co_return watch;
  // Read here: the journal's connection is this thread's alone.
  auto history = checkpoint_history_of(run.id, reads_.events_of_kinds(run.id, checkpoint_history_kinds));
  // Without a checkpoint yet (the run's first attempt, or one begun by a
  // cairn that kept none) nothing says what the workspace held before: its
  // files are kept, and recorded as the baseline.
#ifdef CAIRN_TEST_UNSAFE_NO_ROLL_BACK  // cairn_unsafe_no_roll_back, with which the simulator must fail
  const bool any = history.any, crashed = false;
#else
  const bool any = history.any, crashed = history.any && history.previous_crashed;
#endif
  // A roll-back reads its pieces through a connection of its own, on the thread that does it.
  const auto journal_path = reads_.path();
  const auto journal_options = reads_.options();
  std::size_t rolled_back = 0;
  co_await offload(
      [&] {
        try {
          std::unique_ptr<storage::journal> own;
          const piece_source pieces = [&](const std::string& digest) {
            if (!own) own = storage::open_journal(journal_path, journal_options);
            return own->find_blob(digest);
          };
          workspace_opening opening{run, pieces, std::move(history.state), crashed, p.journal.checkpoint_bytes,
                                    history.bytes};
          auto opened = opener_ ? opener_(std::move(opening)) : open_folder(std::move(opening));
          rolled_back = opened.rolled_back;
          if (!any) {
            watch.baseline = opened.keeper->take();
            if (!watch.baseline)
              watch.baseline = workspace_checkpoint{{{"files", json::object()}, {"removed", json::array()}, {"bytes", 0}}, {}, {}};
          }
          watch.keeper = std::move(opened.keeper);
        } catch (const runtime::sandbox_error& e) {
          watch.warning = fmt::format("this attempt keeps no workspace checkpoints: {}", e.what());
        } catch (const budget_exceeded& e) {
          watch.warning = fmt::format("this attempt keeps no workspace checkpoints: {}", e.message);
        }
      },
      pool::starts);
  if (watch.keeper && rolled_back > 0)
    watch.warning = fmt::format("{} entries of the workspace were put back as the last committed step left them "
                                "(the attempt before ended mid-step)",
                                rolled_back);
  co_return watch;
}

task<std::optional<std::string>> run_journal::start_child(storage::new_run child, const policy& p) {
  if (auto problem = run_id_problem(child.id))
    co_return fmt::format("a child of run {} cannot be named: {}; start the root run with a shorter id", run_id_,
                          *problem);
  // On a shared (PostgreSQL) journal the worker that executes the child gives it one (engine::assign_workspace).
  if (!storage::is_postgres_url(reads_.path().string())) child.workspace = default_workspace(home_, child.id).string();
  co_return co_await writes_.start_child_async(
      run_id_, std::move(child), [&](storage::journal& j) -> std::optional<std::string> {
        const auto tree = tree_of(j, run_id_);
        if (tree.depth + 1 > p.children.max_depth)
          return fmt::format("this run is at depth {} of the tree of run {}, and a child would be deeper than its "
                             "policy allows (children.max_depth {})",
                             tree.depth, tree.root, p.children.max_depth);
        if (tree.size - 1 >= p.children.max)
          return fmt::format("the tree of run {} holds {} child runs, the most its policy allows (children.max)",
                             tree.root, tree.size - 1);
        return std::nullopt;
      });
}

std::uint64_t run_journal::step_count() { return reads_.step_count(run_id_); }

std::vector<protocol::step_result> run_journal::history(std::uint64_t from, std::uint64_t until,
                                                        std::uint64_t max_bytes) {
  std::vector<protocol::step_result> out;
  for (auto& s : reads_.steps_from(run_id_, from, until, max_bytes)) out.push_back(std::move(s.result));
  return out;
}

int run_journal::step_failures(std::uint64_t seq) { return engine::step_failures(reads_, run_id_, seq); }

int run_journal::tool_attempts(std::uint64_t seq) { return engine::tool_attempts(reads_, run_id_, seq); }

std::optional<effects::timer_set> run_journal::timer_at(std::uint64_t seq) {
  return engine::timer_at(reads_, run_id_, seq);
}

std::optional<effects::wait_started> run_journal::wait_at(std::uint64_t seq) {
  return engine::wait_at(reads_, run_id_, seq);
}

std::optional<std::string> run_journal::cancel_requested() {
  auto run = reads_.find_run(run_id_);
  if (!run || !run->cancel_requested_at_ms) return std::nullopt;
  return cancel_reason(reads_, run_id_);
}

task<void> run_journal::confirm_held() { co_await writes_.confirm_held_async(run_id_); }

std::optional<storage::signal_record> run_journal::pending_signal(const std::string& name) {
  return reads_.pending_signal(run_id_, name);
}

std::optional<storage::run_record> run_journal::find_run(const std::string& id) { return reads_.find_run(id); }

std::uint64_t run_journal::llm_tokens_spent() {
  if (auto kept = kept_run_state(reads_, run_id_)) return kept->llm_tokens;
  return derive_tokens(reads_, run_id_, tokens_counted);
}

std::uint64_t tokens_of_step(const protocol::step_result& step) {
  return step.kind == protocol::step_kind::tool && step.name == "llm.chat" && step.ok ? tokens_counted(step.output) : 0;
}

}  // namespace cairn::engine
