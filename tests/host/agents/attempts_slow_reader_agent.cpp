// An agent that reads its start frame (large: the test gives a big input)
// 64 KiB every 4 s, logging each read, to hold the host in its send.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "tests/host/wire.hpp"

using namespace cairn::hostile;

int main() {
  send({{"t", "hello"}, {"v", 2}, {"sdk", "slow-reader"}});
  static char buf[64 * 1024];
  for (long total = 0;;) {
    ssize_t n = ::read(channel_fd(), buf, sizeof buf);
    if (n <= 0) return 0;
    total += n;
    std::printf("read %ld\n", total);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(4));
  }
}
