// How a process that hosts runs keeps its heap. glibc hands the top of a
// heap back to the kernel once more than 128 KiB of it is free; a run's end
// frees that much, and the next run's way in (its journal's first commits,
// its sandbox's setup) faults the same pages in again, one by one: 17-19
// faults in each of a run's first two commits on this project's VM, 0.3-0.5
// ms before its first step.
#pragma once

namespace cairn::engine {

// Keeps up to 8 MiB free at the top of each heap, and serves allocations
// under 1 MiB from the heap (larger ones are still mapped for themselves and
// given back when freed). Process-wide, so the engine does not do it on its
// own: `cairn` calls it first thing; a program that embeds the engine may.
void keep_heap_for_runs();

}  // namespace cairn::engine
