#include "cli/batch_file.hpp"

#include <array>
#include <map>

#include <fmt/format.h>

#include "cli/format.hpp"
#include "engine/run_id.hpp"
#include "protocol/bounded_json.hpp"
#include "protocol/messages.hpp"

namespace cairn::cli {
namespace {

constexpr std::size_t max_line = protocol::default_max_frame;

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Turns each line into a run, in order, remembering the ids given so far.
class batch_parser {
 public:
  explicit batch_parser(const std::string& name) : name_(name) {}

  void add(std::string_view text, std::size_t line) {
    if (blank(text)) return;
    if (runs_.size() == max_batch_runs)
      throw batch_error(fmt::format("{} holds more than {} runs, the most one file may: split it (each file is one "
                                    "transaction)",
                                    name_, max_batch_runs));
    const std::string where = fmt::format("{} line {}", name_, line);
    // One level more than an input may have: the object around it.
    if (protocol::nesting_depth(text) > protocol::max_input_depth + 1) throw too_deep(where);
    json value;
    try {
      value = protocol::parse_bounded(text, where + ": the line", {protocol::max_input_depth + 1, max_line});
    } catch (const protocol::json_error& e) {
      throw batch_error(e.what());
    }
    batch_run run{line, {}, {}};
    if (value.is_object() && value.contains("input")) {
      for (const auto& [key, _] : value.items())
        if (key != "input" && key != "id")
          throw batch_error(fmt::format("{}: the key {} beside \"input\": a line with \"input\" may have only "
                                        "\"input\" and \"id\" (write an input that has a key \"input\" as "
                                        "{{\"input\": ...}})",
                                        where, preview(json(key), 40)));
      if (value.contains("id")) {
        if (!value["id"].is_string()) throw batch_error(where + ": \"id\" is not a string");
        run.id = value["id"].get<std::string>();
        if (auto problem = engine::run_id_problem(run.id)) throw batch_error(where + ": " + *problem);
        const auto [first, fresh] = line_of_.emplace(run.id, line);
        if (!fresh)
          throw batch_error(fmt::format("{}: run id {} is given on line {} already; an id is an idempotency key, so "
                                        "each run of a file needs its own",
                                        where, run.id, first->second));
      }
      run.input = std::move(value["input"]);
    } else {
      run.input = std::move(value);
    }
    if (protocol::nesting_depth(run.input) > protocol::max_input_depth) throw too_deep(where);
    runs_.push_back(std::move(run));
  }

  std::vector<batch_run> take() {
    if (runs_.empty()) throw batch_error(fmt::format("{} holds no run: every line is blank", name_));
    return std::move(runs_);
  }

 private:
  static batch_error too_deep(const std::string& where) {
    return batch_error(fmt::format("{}: the input nests deeper than {} levels, more than a run can be handed; send a "
                                   "flatter value",
                                   where, protocol::max_input_depth));
  }

  const std::string& name_;
  std::vector<batch_run> runs_;
  std::map<std::string, std::size_t> line_of_;
};

}  // namespace

std::vector<batch_run> read_batch(std::istream& in, const std::string& name) {
  batch_parser parser(name);
  std::array<char, 1 << 16> buffer;
  std::string line;
  std::size_t number = 1;
  std::uint64_t total = 0;
  const auto too_long = [&] {
    return batch_error(fmt::format("{} line {}: the line is longer than {} bytes, the most a run's input may be (as "
                                   "with --input)",
                                   name, number, max_line));
  };
  while (in) {
    in.read(buffer.data(), buffer.size());
    const auto got = static_cast<std::size_t>(in.gcount());
    total += got;
    if (total > max_batch_bytes)
      throw batch_error(fmt::format("{} is larger than {} MiB, the most one file may be: split it (each file is one "
                                    "transaction)",
                                    name, max_batch_bytes >> 20));
    std::string_view chunk(buffer.data(), got);
    for (auto end = chunk.find('\n'); end != std::string_view::npos; end = chunk.find('\n')) {
      if (line.size() + end > max_line) throw too_long();
      line.append(chunk.substr(0, end));
      parser.add(line, number++);
      line.clear();
      chunk.remove_prefix(end + 1);
    }
    if (line.size() + chunk.size() > max_line) throw too_long();
    line.append(chunk);
  }
  if (in.bad()) throw batch_error(fmt::format("cannot read {}", name));
  parser.add(line, number);
  return parser.take();
}

}  // namespace cairn::cli
