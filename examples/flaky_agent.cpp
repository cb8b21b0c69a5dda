// An agent whose first attempt crashes hard (abort) in the middle, to show
// that the run resumes from its journal: the steps before the crash are not
// run again. Each step appends a line to /workspace/progress.log, so the log
// shows what really executed.
//
// input: {"batches": 5, "crash_at": 3}
#include <cstdlib>
#include <fstream>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int batches = input.value("batches", 5);
    const int crash_at = input.value("crash_at", 3);
    int total = 0;
    for (int i = 1; i <= batches; ++i) {
      auto out = ctx.step("batch " + std::to_string(i), [&] {
        if (i == crash_at && ctx.attempt() == 1) std::abort();  // the crash: only on the first attempt
        std::ofstream("progress.log", std::ios::app)
            << "batch " << i << " ran in attempt " << ctx.attempt() << "\n";
        return cairn::json{{"batch", i}, {"items", i * 10}};
      });
      total += out["items"].get<int>();
    }
    return cairn::json{{"batches", batches}, {"items", total}};
  });
}
