#include "engine/history_feed.hpp"

#include <fmt/format.h>

namespace cairn::engine {

history_feed::history_feed(storage::journal& journal, std::string run_id, std::uint64_t steps)
    : journal_(journal), run_id_(std::move(run_id)), steps_(steps) {}

std::optional<std::string> history_feed::refuse(const protocol::history_msg& request) const {
  if (request.from >= steps_)
    return fmt::format("history from seq {}, past the {} journaled steps of the history", request.from, steps_);
  if (request.from != next_)
    return fmt::format("history from seq {}; each step is sent once, in order, and the next is {}", request.from,
                       next_);
  return std::nullopt;
}

protocol::history_chunk history_feed::serve() {
  protocol::history_chunk chunk;
  chunk.from = next_;
  for (auto& step : journal_.steps_from(run_id_, next_, steps_, chunk_bytes)) chunk.steps.push_back(std::move(step.result));
  next_ += chunk.steps.size();
  return chunk;
}

}  // namespace cairn::engine
