// The lines of `cairn submit --from` (cli/batch_file.hpp) on any file. Beyond
// not crashing, it asserts:
// - only batch_error escapes, its what() naming the file;
// - every line that is not blank is one run, in order, numbered by its line;
// - each run's input is no deeper than protocol::max_input_depth, and each id
//   given is a valid run id, given once;
// - the runs written back in the header's form ({"input": ..., "id": ...}, one
//   a line) read back as the same runs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/batch_file.hpp"
#include "engine/run_id.hpp"
#include "protocol/bounded_json.hpp"
#include "protocol/messages.hpp"
#include "tests/fuzz/contract.hpp"

using cairn::fuzz::require;
using namespace cairn;

namespace {

const std::string name = "runs.jsonl";

// The numbers of the lines that are not blank (spaces, tabs and CR only).
std::vector<std::size_t> lines_with_runs(std::string_view text) {
  std::vector<std::size_t> numbers;
  for (std::size_t number = 1;; ++number) {
    const auto end = std::min(text.find('\n'), text.size());
    if (text.substr(0, end).find_first_not_of(" \t\r") != std::string_view::npos) numbers.push_back(number);
    if (end == text.size()) return numbers;
    text.remove_prefix(end + 1);
  }
}

bool same_runs(const std::vector<cli::batch_run>& a, const std::vector<cli::batch_run>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const auto& x, const auto& y) { return x.input == y.input && x.id == y.id; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  std::vector<cli::batch_run> runs;
  try {
    runs = cli::read_batch(in, name);
  } catch (const cli::batch_error& e) {
    require(std::string_view(e.what()).starts_with(name), "a batch_error does not name the file");
    return 0;
  }
  const auto numbers = lines_with_runs(text);
  require(runs.size() == numbers.size(), "the runs are not the lines that are not blank");
  std::set<std::string> ids;
  std::string written;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& run = runs[i];
    require(run.line == numbers[i], "a run is not numbered by its line");
    require(protocol::nesting_depth(run.input) <= protocol::max_input_depth, "an input nests too deep");
    if (!run.id.empty()) {
      require(!engine::run_id_problem(run.id), "an id is not a valid run id");
      require(ids.insert(run.id).second, "an id is given twice");
    }
    nlohmann::json line = {{"input", run.input}};
    if (!run.id.empty()) line["id"] = run.id;
    written += line.dump() + "\n";
  }
  std::istringstream again(written);
  require(same_runs(cli::read_batch(again, name), runs), "the runs written back read back otherwise");
  return 0;
}
