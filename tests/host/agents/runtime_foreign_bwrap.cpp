// Not an agent: a stranger's process that looks like a cairn sandbox's pid 1
// (run as `bwrap --args 4 -- /run/cairn/agent`, pid 1 of its own pid
// namespace, its parent no bwrap). Sweeps used to kill it for its command
// line alone. Waits until killed.
#include <unistd.h>

int main() {
  for (;;) ::pause();
}
