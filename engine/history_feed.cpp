#include "engine/history_feed.hpp"

#include <fmt/format.h>

namespace cairn::engine {

history_feed::history_feed(attempt_journal& journal, std::uint64_t steps) : journal_(journal), steps_(steps) {}

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
  chunk.steps = journal_.history(next_, steps_, chunk_bytes);
  next_ += chunk.steps.size();
  return chunk;
}

}  // namespace cairn::engine
