#include "engine/tools/name_resolver.hpp"

#include <unistd.h>

#include <algorithm>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fmt/format.h>

namespace cairn::engine::http {

struct name_resolver::lookup {
  std::string host;
  int waiting = 0;     // callers that have not left
  bool begun = false;  // a thread calls lookup_ for it
  std::optional<lookup_answer> answer;
};

lookup_answer system_lookup(const std::string& host) {
  namespace net = boost::asio;
  net::io_context context;  // the synchronous resolve starts no thread of its own
  net::ip::tcp::resolver resolver(context);
  boost::system::error_code error;
  auto entries = resolver.resolve(host, "", error);
  if (error) return {{}, error.message()};
  lookup_answer answer;
  for (const auto& entry : entries) answer.addresses.push_back(entry.endpoint().address().to_string());
  return answer;
}

name_resolver::name_resolver(lookup_function lookup, std::size_t threads, std::size_t max_waiting)
    : lookup_(std::move(lookup)), max_waiting_(max_waiting) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i) threads_.emplace_back([this] { serve(); });
}

name_resolver::~name_resolver() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  for (auto& t : threads_) t.join();
}

std::optional<lookup_answer> name_resolver::resolve(const std::string& host,
                                                    std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  auto& slot = by_host_[host];
  if (!slot) {
    if (queue_.size() >= max_waiting_) {
      by_host_.erase(host);
      return lookup_answer{{}, fmt::format("{} other names wait to be looked up: the system's resolver is slow or "
                                           "does not answer",
                                           queue_.size())};
    }
    slot = std::make_shared<lookup>();
    slot->host = host;
    queue_.push_back(slot);
    queued_.notify_one();
  }
  auto mine = slot;
  ++mine->waiting;
  const bool answered = answered_.wait_until(lock, deadline, [&] { return mine->answer.has_value(); });
  --mine->waiting;
  if (answered) return mine->answer;
  // The last caller to leave takes a lookup not begun with it: nobody would read its answer.
  if (mine->waiting == 0 && !mine->begun) {
    std::erase(queue_, mine);
    by_host_.erase(host);
  }
  return std::nullopt;
}

void name_resolver::serve() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto next = std::move(queue_.front());
    queue_.pop_front();
    next->begun = true;
    lock.unlock();
    lookup_answer answer;
    try {
      answer = lookup_(next->host);
    } catch (const std::exception& e) {
      answer.error = e.what();
    }
    lock.lock();
    next->answer = std::move(answer);
    // Later callers of the name look it up anew: an answer is as fresh as the lookup.
    by_host_.erase(next->host);
    answered_.notify_all();
  }
}

name_resolver& process_resolver() {
  static std::mutex mutex;
  static name_resolver* made = nullptr;
  static pid_t made_by = 0;
  std::lock_guard lock(mutex);
  if (made_by != ::getpid()) {
    made = new name_resolver;
    made_by = ::getpid();
  }
  return *made;
}

}  // namespace cairn::engine::http
