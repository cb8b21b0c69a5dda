// The agent's half of a step's floor: one frame-sized message to another
// thread over a socketpair and back, as an agent's step reaches the host
// and its ack returns. step_latency and scale_out add it to the raw commit.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "bench/stats.hpp"

namespace bench {

inline summary socketpair_round_trip(int n) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return {};
  std::thread echo([fd = sv[1], n] {
    char buf[256];
    for (int i = 0; i < n; ++i) {
      ssize_t got = read(fd, buf, sizeof buf);
      if (got <= 0 || write(fd, buf, static_cast<std::size_t>(got)) != got) return;
    }
  });
  std::vector<double> us;
  char msg[96] = "{\"t\":\"step\",\"seq\":1}";
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (write(sv[0], msg, sizeof msg) != sizeof msg) break;
    std::size_t got = 0;
    while (got < sizeof msg) {
      ssize_t r = read(sv[0], msg + got, sizeof msg - got);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  echo.join();
  close(sv[0]);
  close(sv[1]);
  return summarize(us);
}

}  // namespace bench
