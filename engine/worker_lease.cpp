#include "engine/worker_lease.hpp"

#include <future>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "engine/owner.hpp"

namespace cairn::engine {

worker_lease::worker_lease(ledger& writes, asio::io_context& io, lease_settings settings, std::function<void()> lost,
                           std::function<void(const std::string&)> report)
    : writes_(writes),
      io_(io),
      settings_(std::move(settings)),
      lost_(std::move(lost)),
      report_(std::move(report)),
      timer_(io) {
  record_ = fresh_record();
  writes_.register_worker(record_);
  asio::co_spawn(io_, renew(), asio::detached);
}

worker_lease::~worker_lease() {
  stopping_ = true;
  // Waits for the cancel itself too, not only for renew() to end: renew()
  // may end on its own first (it saw stopping_ at a wake-up), and the
  // cancel must not touch timer_ once this object is gone (ThreadSanitizer
  // saw that race in cairn serve's stop).
  std::promise<void> cancelled;
  asio::post(io_, [this, &cancelled] {
    timer_.cancel();
    cancelled.set_value();
  });
  cancelled.get_future().wait();
  stopped_.get_future().wait();
  try {
    writes_.remove_worker(record_.id);
  } catch (const std::exception& e) {
    if (report_) report_(fmt::format("could not remove this worker from the journal ({}); its row expires with its lease",
                                     e.what()));
  }
}

storage::worker_record worker_lease::fresh_record() const {
  const auto& me = current_owner();
  const auto now = storage::now_ms();
  return {me.str(), me.hostname, settings_.workspace_root, now, now, now + settings_.lease.count(), 0, 0};
}

task<void> worker_lease::renew() {
  // A third of the lease: two renewals may fail (a slow disk, a busy
  // database) before the lease runs out.
  const auto every = settings_.lease / 3;
  bool failing = false;
  while (!stopping_) {
    timer_.expires_after(every);
    co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (stopping_) break;
    try {
      const bool renewed = co_await writes_.renew_lease_async(
          record_.id, storage::now_ms() + settings_.lease.count(), writes_.fenced_writes());
      if (!renewed) {
        if (lost_) lost_();
        record_ = fresh_record();
        record_.fenced_writes = writes_.fenced_writes();
        co_await writes_.register_worker_async(record_);
      }
      if (failing && report_) report_("this worker's lease is renewed again");
      failing = false;
    } catch (const std::exception& e) {
      // Said once for a run of failures (a database restarting fails every renewal until it is back).
      if (!failing && report_) report_(fmt::format("could not renew this worker's lease: {}", e.what()));
      failing = true;
    }
  }
  stopped_.set_value();
}

}  // namespace cairn::engine
