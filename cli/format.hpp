// How runs and steps look in the terminal and in --json.
#pragma once

#include <optional>
#include <string>

#include "storage/journal.hpp"

namespace cairn::cli {

using json = nlohmann::json;

// `text` as it may reach a terminal: C0 controls, DEL, C1 controls, line and
// paragraph separators and bidi overrides shown as visible escapes (\x1b,
// \n, \u009b, \u202e), invalid UTF-8 as U+FFFD. Newlines are kept only with
// `keep_newlines` (for text printed as a block), so a one-line field cannot
// print a line that looks like cairn's own. Idempotent. Everything an agent
// wrote passes through it before it is printed.
std::string terminal_text(std::string_view text, bool keep_newlines = false);

// `value` on one line, terminal-safe, at most `width` bytes.
std::string preview(const json& value, std::size_t width = 60);
std::string format_time(std::int64_t ms);
// The time `text` names, in ms since the epoch: a time ago from `now_ms`
// ("90s", "15m", "2h", "3d") or a UTC date ("2026-12-07", "2026-12-07T14:30",
// "2026-12-07T14:30:05"). Anything else is std::invalid_argument, saying so.
std::int64_t time_since(const std::string& text, std::int64_t now_ms);
std::string format_duration_us(std::int64_t us);
// "512 B", "3.4 KiB", "12.0 MiB", "1.5 GiB".
std::string format_bytes(std::uint64_t bytes);

// One line per step, as `cairn run` prints them while journaling, with its
// kind (step, tool, sleep, signal, child, join, now, random) before its name.
std::string step_line(const storage::step_record& step);
// The table of a run's steps, printed a row at a time (a history of any
// size is streamed): its header, then a row per step.
std::string steps_header();
// The run's kept state (engine/run_state.hpp; nullopt for a run that
// predates it) and the bytes its history occupies, for `cairn show`;
// `next_seq` is the step after the last journaled.
std::string state_summary(const std::optional<json>& kept, std::uint64_t journal_bytes, std::uint64_t next_seq);
std::string step_row(const storage::step_record& s);
// A journal event as `cairn show` and `cairn logs` list it, on one line:
// its time, kind, step and data; and whether they list it (what the schema
// marks notable, and a kind written by a newer cairn).
std::string event_line(const storage::event_record& e);
bool notable(const storage::event_record& e);
std::string runs_table(storage::journal& journal, const std::vector<storage::run_record>& runs);
std::string run_summary(const storage::run_record& run);
// What a waiting run waits for, and how to end the wait: "waits for signal
// 'approval' (step 2); send it: cairn signal RUN approval --data JSON".
std::string describe_wait(const storage::run_record& run);
// The run's stored policy (engine/policy.hpp's JSON): network, limits, tools.
std::string policy_summary(const json& policy);

json to_json(const storage::run_record& run);
// A worker (`cairn workers`): its lease as seen at `now_ms`.
json to_json(const storage::worker_record& worker, std::int64_t now_ms);
std::string workers_table(const std::vector<storage::worker_record>& workers, std::int64_t now_ms);
// A worker whose lease expired over journal::forgotten_worker_ms ago and that
// holds no run: killed, and forgotten by the next worker that registers.
bool forgettable(const storage::worker_record& w, std::int64_t now_ms);
json to_json(const storage::step_record& step);
json to_json(const storage::event_record& event);
json to_json(const storage::signal_record& signal);

}  // namespace cairn::cli
