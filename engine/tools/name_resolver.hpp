// Name lookups for the host's tools, bounded for the whole process.
//
// getaddrinfo cannot be cancelled, and a resolver that never answers holds
// the thread that asked for as long as the system's resolver options say
// (seconds per name server). A detached thread per lookup let one run whose
// grant set a 1 ms timeout leave 2,541 threads behind in 8 s. Here a fixed
// number of threads make every lookup: a caller waits for its answer until
// its own deadline and then leaves; its lookup is dropped if no thread has
// begun it, and its answer goes to nobody if one has. A caller asking for a
// name whose lookup is waiting or under way waits for that one. At most
// `max_waiting` names wait for a thread; beyond, a caller is told at once.
// Internal to engine/tools.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace cairn::engine::http {

// What a lookup found: the name's addresses as text ("127.0.0.1", "::1"),
// or why there are none.
struct lookup_answer {
  std::vector<std::string> addresses;
  std::string error;  // empty when the lookup succeeded
};

// Looks up one name, blocking. The system's resolver (getaddrinfo) by
// default; tests put in one that never answers.
using lookup_function = std::function<lookup_answer(const std::string& host)>;
lookup_answer system_lookup(const std::string& host);

class name_resolver {
 public:
  static constexpr std::size_t default_threads = 4;
  static constexpr std::size_t default_max_waiting = 256;

  // Starts `threads` threads (at least one) that call `lookup`.
  explicit name_resolver(lookup_function lookup = system_lookup, std::size_t threads = default_threads,
                         std::size_t max_waiting = default_max_waiting);
  // Drops the lookups no thread has begun and waits for those begun:
  // `lookup` must return eventually (getaddrinfo does). No caller may be in
  // resolve() any more.
  ~name_resolver();
  name_resolver(const name_resolver&) = delete;
  name_resolver& operator=(const name_resolver&) = delete;

  // The addresses of `host`, or nullopt when they were not found by
  // `deadline`. Too many names waiting is an answer with an error. Blocks
  // the caller until then: a tool call's thread (engine/io.hpp's
  // pool::tools, where http.fetch and llm.chat run), never an event loop.
  std::optional<lookup_answer> resolve(const std::string& host, std::chrono::steady_clock::time_point deadline);

 private:
  struct lookup;
  void serve();

  lookup_function lookup_;
  std::size_t max_waiting_;
  std::mutex mutex_;
  std::condition_variable queued_;    // a lookup waits for a thread, or stopping_
  std::condition_variable answered_;  // some lookup has its answer
  std::deque<std::shared_ptr<lookup>> queue_;
  std::map<std::string, std::shared_ptr<lookup>> by_host_;  // queued or under way
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The resolver of this process, made at first use (again in a forked
// child, which has none of its parent's threads) and never destroyed: its
// threads may be waiting for a resolver that does not answer.
name_resolver& process_resolver();

}  // namespace cairn::engine::http
