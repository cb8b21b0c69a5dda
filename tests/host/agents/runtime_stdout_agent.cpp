// Attack on the run's log (issue 9.4): the agent's stdout used to be the
// host's log file. It fallocates 200 MiB on it, tries to truncate it, then
// writes 3 MiB of numbered lines to it, on every attempt.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    cairn::json seen;
    seen["fallocate"] = ::fallocate(1, FALLOC_FL_KEEP_SIZE, 0, 200 << 20) == 0;
    seen["ftruncate"] = ::ftruncate(1, 0) == 0;
    const int lines = input.value("lines", 30000);
    for (int i = 0; i < lines; ++i)
      std::printf("line %08d of the agent's output, padded to about one hundred bytes ....................\n", i);
    std::printf("last line of attempt %d\n", ctx.attempt());
    std::fflush(stdout);
    if (input.value("crash_first", false) && ctx.attempt() == 1) std::_Exit(3);
    return seen;
  });
}
