// bench/conversation: what a growing model conversation costs the journal,
// in two shapes. An agent makes 100 llm.chat calls, each sent the whole
// conversation so far (as every framework agent does), with a 5 KB tool
// output joining it after each call and a reply from the model
// (cairn-mock-llm): 3 KB in the first shape (a model that writes), a
// sentence in the second (a tool-calling agent: short assistant messages
// between long tool outputs). Then it crashes and its second attempt replays
// every call from the journal. Measured for each shape, at 100 calls and at
// 50: journal bytes against the final conversation (goal <= 1.0), how the
// journal grows from 50 calls to 100 (2.0 is linear, 4.0 quadratic), against
// what journaling each request whole would store, and whether the replay and
// the journaled requests are byte-identical to what the first attempt sent
// and received.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

struct measured {
  std::size_t conversation = 0, outputs = 0, whole_requests = 0, journaled_identical = 0, requests = 0;
  std::uint64_t journal_bytes = 0, db_bytes = 0;
  int requests_identical = 0, replies_identical = 0;
  double seconds = 0;
};

measured measure(int calls, int reply_bytes) {
  const std::size_t output_bytes = 5000;
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
  measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(mock, SIGTERM);
  ::waitpid(mock, nullptr, 0);
  if (run.status != storage::run_status::completed) {
    std::fprintf(stderr, "conversation: the run did not complete: %s\n", run.error ? run.error->message.c_str() : "?");
    std::exit(1);
  }

  // The requests as journaled, against what the agent sent.
  for (const auto& e : journal->events(r.id)) {
    if (e.kind != "tool_started") continue;
    const std::string text = e.data.at("args").dump();
    m.whole_requests += text.size();
    m.journaled_identical +=
        m.requests < run.output["requests"].size() && run.output["requests"][m.requests] == fnv1a(text);
    ++m.requests;
  }
  m.conversation = run.output["conversation_bytes"].get<std::size_t>();
  m.outputs = run.output["outputs_bytes"].get<std::size_t>();
  m.requests_identical = run.output["requests_identical"].get<int>();
  m.replies_identical = run.output["replies_identical"].get<int>();
  m.journal_bytes = journal->bytes_of_run(r.id);
  std::error_code ec;
  const auto wal_bytes = fs::file_size(dir / "cairn.db-wal", ec);
  m.db_bytes = fs::file_size(dir / "cairn.db") + (ec ? 0 : wal_bytes);
  bench::remove_bench_folder(dir);
  return m;
}

void report(const char* shape, int calls, int reply_bytes) {
  const measured half = measure(std::max(1, calls / 2), reply_bytes);
  const measured m = measure(calls, reply_bytes);
  std::printf("\n%s: %d llm.chat calls, each sent the whole conversation; 5000-byte tool outputs, %d-byte replies; "
              "%.1f s for both attempts\n",
              shape, calls, reply_bytes, m.seconds);
  std::printf("%-58s %12zu  (~%zu tokens at 4 bytes each)\n", "final conversation, bytes", m.conversation,
              m.conversation / 4);
  std::printf("%-58s %12zu\n", "all tool outputs, bytes", m.outputs);
  std::printf("%-58s %12zu\n", "every request journaled whole would be, bytes", m.whole_requests);
  std::printf("%-58s %12llu\n", "the run's journal (steps, events, payloads), bytes",
              static_cast<unsigned long long>(m.journal_bytes));
  std::printf("%-58s %12llu\n", "the same at half the calls, bytes", static_cast<unsigned long long>(half.journal_bytes));
  std::printf("%-58s %12llu\n", "the database and its WAL on disk, bytes", static_cast<unsigned long long>(m.db_bytes));
  std::printf("ratio: journal / conversation = %.2f (goal <= 1.00); journaled whole it would be %.1f\n",
              static_cast<double>(m.journal_bytes) / static_cast<double>(m.conversation),
              static_cast<double>(m.whole_requests) / static_cast<double>(m.conversation));
  std::printf("growth: journal at %d calls / at %d = %.2f (2.00 linear, 4.00 quadratic)\n", calls,
              std::max(1, calls / 2), static_cast<double>(m.journal_bytes) / static_cast<double>(half.journal_bytes));
  std::printf("replay: %d of %d requests and %d of %d replies byte-identical to the first attempt's; %zu of %zu "
              "journaled requests byte-identical to what was sent\n",
              m.requests_identical, calls, m.replies_identical, calls, m.journaled_identical, m.requests);
}

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  const int calls = bench::count_arg(argc, argv, 1, 100, "[CALLS, default 100]");
  report("long replies", calls, 3000);
  report("tool calls", calls, 60);
  return 0;
}
