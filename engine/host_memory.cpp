#include "engine/host_memory.hpp"

#include <malloc.h>

namespace cairn::engine {

void keep_heap_for_runs() {
  // Setting either turns off glibc's own adjustment of both: set both.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 8 << 20);
}

}  // namespace cairn::engine
