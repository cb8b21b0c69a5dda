// Whether a run has finished: the one answer engine/ and cli/ use. It means
// what storage/journal.hpp says of run_status (and storage's own
// detail::is_finished answers): its home is beside run_status once storage
// offers it there.
#pragma once

#include "storage/journal.hpp"

namespace cairn::engine {

// completed, failed and cancelled are final: the run never moves again.
// in_doubt is not: `cairn settle` records what its tool call did, and the run
// goes on.
inline bool is_finished(storage::run_status s) {
  return s == storage::run_status::completed || s == storage::run_status::failed ||
         s == storage::run_status::cancelled;
}

}  // namespace cairn::engine
