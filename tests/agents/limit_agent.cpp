// Test agent that runs into one of its sandbox's limits inside a step.
// input: {"bomb": "memory" | "processes" | "cpu" | "workspace"}
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include <cairn/cairn.hpp>

using cairn::json;

namespace {

void memory_bomb() {
  // Several processes, each under RLIMIT_AS, together over the sandbox's total.
  for (int i = 0; i < 8; ++i) {
    if (fork() == 0) {
      std::vector<char*> blocks;
      for (;;) {
        char* p = static_cast<char*>(malloc(8 << 20));
        if (!p) pause();
        std::memset(p, 1, 8 << 20);
        asm volatile("" ::"r"(p) : "memory");  // the memory is used: the compiler may not drop it
        blocks.push_back(p);
      }
    }
  }
  for (;;) pause();
}

void fork_bomb() {
  for (;;) {
    pid_t pid = fork();
    if (pid == 0) pause();
    if (pid < 0) usleep(1000);
  }
}

void cpu_spin() {
  volatile unsigned long x = 0;
  for (;;) x = x + 1;
}

void fill_workspace() {
  std::ofstream out("filler.bin", std::ios::binary);
  std::vector<char> block(1 << 20, 'x');
  for (;;) {
    out.write(block.data(), static_cast<std::streamsize>(block.size()));
    out.flush();
    if (!out) pause();  // ENOSPC: wait for the host to notice
  }
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    ctx.step("before", [] { return "ok"; });
    const std::string bomb = input.value("bomb", "");
    return ctx.step("bomb", [&]() -> json {
      if (bomb == "memory") memory_bomb();
      if (bomb == "processes") fork_bomb();
      if (bomb == "cpu") cpu_spin();
      if (bomb == "workspace") fill_workspace();
      return "no bomb";
    });
  });
}
