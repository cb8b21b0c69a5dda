// The one thread of a helper that lives as long as the process (the images
// made ahead, the images deleted after their runs): started when first
// needed, stopped with its helper, at exit. Internal to runtime/.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

namespace cairn::runtime {

class background_thread {
 public:
  // Starts `body` unless it runs already. Call with the helper's mutex held.
  template <class Body>
  void start(Body&& body) {
    if (thread_.joinable()) return;
    owner_ = ::getpid();
    thread_ = std::thread(std::forward<Body>(body));
  }

  // Sets `stopping` under `mutex`, wakes the thread and waits for it to end.
  void stop(std::mutex& mutex, bool& stopping, std::condition_variable& wake) {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (!thread_.joinable()) return;
    // A forked child has the object but not the thread.
    if (::getpid() == owner_)
      thread_.join();
    else
      thread_.detach();
  }

 private:
  std::thread thread_;
  pid_t owner_ = 0;
};

}  // namespace cairn::runtime
