// The runs of a batch file, `cairn submit --from FILE`: JSON Lines, one run
// per line that is not blank (blank: empty or only spaces, tabs and CR).
// A line that is a JSON object with the key "input" gives the run's input
// there and, optionally, under "id", its run id (a string; the idempotency
// key, as --id; generated when absent); it has no other key. Any other
// line is the run's input itself. So an input that is an object with a key
// "input" of its own is written {"input": {"input": ...}}.
//
//   {"question": "2+2?"}                     input {"question": "2+2?"}, id generated
//   {"input": {"question": "3+3?"}, "id": "q3"}  input {"question": "3+3?"}, id q3
//   "plain text"                             input "plain text"
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::cli {

// What one file may hold: it is submitted in one transaction and held in
// memory until then (about 6 KB a run beside its input: 10,000 small runs
// peak at 64 MiB); a larger batch is split into several files. A line is at
// most protocol::default_max_frame bytes, as --input is.
inline constexpr std::size_t max_batch_runs = 10'000;
inline constexpr std::uint64_t max_batch_bytes = 64u << 20;

struct batch_run {
  std::size_t line = 0;  // 1-based, blank lines counted
  nlohmann::json input;
  std::string id;  // empty: generated
};

// A batch file that cannot be submitted; what() names the file and, where
// one is to blame, the line: "runs.jsonl line 17: ...".
class batch_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads every run of `in`, named `name` in errors. Throws batch_error, having
// read no further, at the first line that is not JSON, is longer than a
// line may be, nests deeper than protocol::max_input_depth (as an input), has
// an id that is not a valid run id (engine/run_id.hpp) or that an earlier
// line gave, or has "input" beside a key other than "id"; at a file over
// the bounds above, one that holds no run, or one that cannot be read.
std::vector<batch_run> read_batch(std::istream& in, const std::string& name);

}  // namespace cairn::cli
