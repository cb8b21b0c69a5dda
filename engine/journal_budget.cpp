#include "engine/journal_budget.hpp"

#include <fmt/format.h>

#include "protocol/bounded_json.hpp"
#include "storage/payloads.hpp"

namespace cairn::engine {

journal_budget::journal_budget(storage::journal& journal, const std::string& run_id, const journal_limits& limits)
    : limits_(limits), used_(journal.bytes_of_run(run_id)) {}

void journal_budget::charge_step(const protocol::step_result& step) {
  const std::uint64_t bytes = step.name.size() + (step.ok ? protocol::dumped_size(step.output)
                                                          : step.error.message.size() + step.error.type.size());
  const std::string what = fmt::format("step {} ('{}')", step.seq, step.name.substr(0, 64));
  if (bytes > limits_.step_output_bytes)
    throw budget_exceeded{"step_output_mb",
                          fmt::format("{} holds {} bytes, more than one step may ({} MiB, limits.step_output_mb in "
                                      "the policy); it was not journaled",
                                      what, bytes, limits_.step_output_bytes >> 20)};
  if (!step.ok) return charge(bytes, what);
  const auto stored = storage::encode_output(step.output);
  charge_with(step.name.size() + stored.text.size(), stored.pieces, what);
}

void journal_budget::charge_event(std::string_view kind, const json& data) {
  const auto split = storage::split_payloads(data);
  charge_with(kind.size() + protocol::dumped_size(split.manifest), split.pieces, fmt::format("a {} event", kind));
}

void journal_budget::charge_with(std::uint64_t bytes, const std::vector<storage::payload>& pieces,
                                 const std::string& what) {
  std::vector<const std::string*> added;
  for (const auto& piece : pieces)
    if (!charged_payloads_.contains(piece.digest)) {
      bytes += piece.digest.size() + piece.body.size();
      added.push_back(&piece.digest);
    }
  charge(bytes, what);
  for (const auto* digest : added) charged_payloads_.insert(*digest);
}

void journal_budget::charge(std::uint64_t bytes, const std::string& what) {
  if (used_ + bytes > limits_.journal_bytes)
    throw budget_exceeded{"journal_mb",
                          fmt::format("the run's journal would grow past {} MiB (limits.journal_mb in the policy): it "
                                      "holds {} bytes and {} adds {}; it was not journaled",
                                      limits_.journal_bytes >> 20, used_, what, bytes)};
  used_ += bytes;
}

}  // namespace cairn::engine
