// Benchmark agent of bench/conversation: a model conversation that grows with
// every call, as a framework agent's does. `calls` llm.chat calls, each sent
// the whole conversation so far; after each, a step whose `output_bytes`
// output (a tool's result) joins the conversation. On attempt 1 it keeps a
// digest of every request it sent and every reply it got in /workspace, then
// crashes; attempt 2 replays them all from the journal and compares.
// input: {"calls": 100, "output_bytes": 5000}
// output: {"requests": [digest, ...], "conversation_bytes": N, "outputs_bytes": N,
//          "requests_identical": n, "replies_identical": n, "attempt": 2}
#include <signal.h>
#include <unistd.h>

#include <fstream>

#include <cairn/cairn.hpp>

#include "bench/fnv1a.hpp"

using cairn::json;

namespace {

using bench::fnv1a;

// A tool's output: text that differs from call to call.
std::string output_of(int call, std::size_t bytes) {
  std::string s(bytes, ' ');
  for (std::size_t j = 0; j < bytes; ++j)
    if (j % 7 != 6) s[j] = static_cast<char>('a' + (j * 31 + static_cast<std::size_t>(call) * 17 + j / 7) % 26);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const int calls = input.value("calls", 100);
    const auto bytes = input.value("output_bytes", std::size_t{5000});
    json messages = json::array({{{"role", "system"}, {"content", "You are a research agent. Use the tools."}},
                                 {{"role", "user"}, {"content", "Survey write-ahead logging, one source at a time."}}});
    json requests = json::array(), replies = json::array();
    std::size_t outputs_bytes = 0;
    for (int i = 0; i < calls; ++i) {
      const json args = {{"messages", messages}, {"max_tokens", 4096}};
      requests.push_back(fnv1a(args.dump()));
      const json reply = ctx.tool("llm.chat", args);
      replies.push_back(fnv1a(reply.dump()));
      messages.push_back({{"role", "assistant"}, {"content", reply.at("content")}});
      const auto out = ctx.step("read source " + std::to_string(i), [&] { return output_of(i, bytes); }).get<std::string>();
      outputs_bytes += out.size();
      messages.push_back({{"role", "user"}, {"content", out}});
    }
    const json seen = {{"requests", requests}, {"replies", replies}};
    if (ctx.attempt() == 1) {
      std::ofstream("/workspace/attempt1.json") << seen.dump();
      ::kill(::getpid(), SIGKILL);
    }
    json first = json::parse(std::ifstream("/workspace/attempt1.json"));
    int same_requests = 0, same_replies = 0;
    for (int i = 0; i < calls; ++i) {
      same_requests += first["requests"][i] == requests[i];
      same_replies += first["replies"][i] == replies[i];
    }
    return {{"requests", requests},
            {"conversation_bytes", messages.dump().size()},
            {"outputs_bytes", outputs_bytes},
            {"requests_identical", same_requests},
            {"replies_identical", same_replies},
            {"attempt", ctx.attempt()}};
  });
}
