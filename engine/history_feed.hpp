// The host's side of a streamed replay (PROTOCOL.md §4): serves the run's
// journaled steps to the agent in chunks it pulls, so a history of any size
// resumes while neither side holds more than a chunk. Each step is served at
// most once per attempt, so an agent cannot make the host read the journal
// more than once over.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/attempt.hpp"
#include "protocol/messages.hpp"

namespace cairn::engine {

class history_feed {
 public:
  // About this much JSON per chunk; a larger step travels alone (it fits a
  // frame: it came in one).
  static constexpr std::uint64_t chunk_bytes = 1u << 20;

  // The history is the run's first `steps` steps. `journal` must outlive the feed.
  history_feed(attempt_journal& journal, std::uint64_t steps);

  // Why `request` breaks the protocol (its `from` is not the first step not
  // yet served, or is past the history), or nullopt when serve() may answer it.
  std::optional<std::string> refuse(const protocol::history_msg& request) const;
  // The next chunk: from the first step not yet served on. Only after refuse() found nothing.
  protocol::history_chunk serve();

 private:
  attempt_journal& journal_;
  std::uint64_t steps_;
  std::uint64_t next_ = 0;  // the first step not yet served
};

}  // namespace cairn::engine
