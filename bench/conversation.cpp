// bench/conversation: what a growing model conversation costs the journal.
// An agent makes 100 llm.chat calls, each sent the whole conversation so far
// (as every framework agent does), with a 5 KB tool output joining it after
// each call and a 3 KB reply from the model (cairn-mock-llm); then it crashes
// and its second attempt replays every call from the journal. Measured:
// journal bytes against the final conversation plus all tool outputs (goal
// <= 3x), against what journaling each request whole would store, and
// whether the replay and the journaled requests are byte-identical to what
// the first attempt sent and received.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench/args.hpp"
#include "bench/fnv1a.hpp"
#include "engine/engine.hpp"
#include "engine/host_memory.hpp"

using namespace cairn;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using bench::fnv1a;

// cairn-mock-llm on a free loopback port; returns its pid and port.
std::pair<pid_t, int> start_mock(const fs::path& dir, int summary_bytes) {
  const auto port_file = dir / "port";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const std::string bytes = std::to_string(summary_bytes), port = port_file.string();
    ::execl(MOCK_LLM_SERVER, MOCK_LLM_SERVER, "--port", "0", "--port-file", port.c_str(), "--summary-bytes",
            bytes.c_str(), nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 1000 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  int port = 0;
  std::ifstream(port_file) >> port;
  if (port == 0) {
    std::fprintf(stderr, "conversation: cairn-mock-llm did not start\n");
    std::exit(1);
  }
  return {pid, port};
}

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  const int calls = bench::count_arg(argc, argv, 1, 100, "[CALLS, default 100]");
  const std::size_t output_bytes = 5000;
  const int reply_bytes = 3000;
  const fs::path dir = fs::temp_directory_path() / ("cairn-bench-conversation-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto [mock, port] = start_mock(dir, reply_bytes);

  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
  options.retry_backoff = std::chrono::milliseconds(10);
  options.llm = engine::llm_endpoint{"http://127.0.0.1:" + std::to_string(port) + "/v1", "", "mock-1"};
  engine::engine eng(*journal, options);
  engine::run_request r;
  r.id = "conversation";
  r.agent = CONVERSATION_AGENT;
  r.input = {{"calls", calls}, {"output_bytes", output_bytes}};
  r.workspace = dir / "ws";
  r.policy = engine::parse_policy({{"tools", {{"llm.chat", {{"max_tokens", 4096}}}}}});
  eng.submit(r);
  const auto t0 = std::chrono::steady_clock::now();
  auto run = eng.execute(r.id);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(mock, SIGTERM);
  ::waitpid(mock, nullptr, 0);
  if (run.status != storage::run_status::completed) {
    std::fprintf(stderr, "conversation: the run did not complete: %s\n", run.error ? run.error->message.c_str() : "?");
    return 1;
  }

  // The requests as journaled, against what the agent sent.
  std::size_t whole_requests = 0, journaled_identical = 0, n = 0;
  for (const auto& e : journal->events(r.id)) {
    if (e.kind != "tool_started") continue;
    const std::string text = e.data.at("args").dump();
    whole_requests += text.size();
    journaled_identical += n < run.output["requests"].size() && run.output["requests"][n] == fnv1a(text);
    ++n;
  }
  const auto conversation = run.output["conversation_bytes"].get<std::size_t>();
  const auto outputs = run.output["outputs_bytes"].get<std::size_t>();
  const auto journal_bytes = journal->bytes_of_run(r.id);
  std::error_code ec;
  const auto wal_bytes = fs::file_size(dir / "cairn.db-wal", ec);
  const auto db_bytes = fs::file_size(dir / "cairn.db") + (ec ? 0 : wal_bytes);

  std::printf("conversation: %d llm.chat calls, each sent the whole conversation; %zu-byte tool outputs, %d-byte "
              "replies; %.1f s for both attempts\n",
              calls, output_bytes, reply_bytes, seconds);
  std::printf("%-58s %12zu  (~%zu tokens at 4 bytes each)\n", "final conversation, bytes", conversation,
              conversation / 4);
  std::printf("%-58s %12zu\n", "all tool outputs, bytes", outputs);
  std::printf("%-58s %12zu\n", "every request journaled whole would be, bytes", whole_requests);
  std::printf("%-58s %12llu\n", "the run's journal (steps, events, payloads), bytes",
              static_cast<unsigned long long>(journal_bytes));
  std::printf("%-58s %12llu\n", "the database and its WAL on disk, bytes", static_cast<unsigned long long>(db_bytes));
  std::printf("ratio: journal / (conversation + outputs) = %.2f (goal <= 3.00); journaled whole it would be %.1f\n",
              static_cast<double>(journal_bytes) / static_cast<double>(conversation + outputs),
              static_cast<double>(whole_requests) / static_cast<double>(conversation + outputs));
  std::printf("replay: %d of %d requests and %d of %d replies byte-identical to the first attempt's; %zu of %zu "
              "journaled requests byte-identical to what was sent\n",
              run.output["requests_identical"].get<int>(), calls, run.output["replies_identical"].get<int>(), calls,
              journaled_identical, n);
  bench::remove_bench_folder(dir);
  return 0;
}
