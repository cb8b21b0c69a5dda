// Wake-ups across processes: a process that committed a change another
// process may be waiting for (a run submitted, signalled, cancelled, ended,
// suspended or handed back) says so with notify(); a daemon owns a
// wake_listener that hears it at once. A wake-up is only a hint: whoever
// hears one re-reads the journal, and one that is lost (a full queue, a
// listener that cannot be reached) is found by the listener's own periodic
// check. PostgreSQL's LISTEN/NOTIFY fills the same seam.
//
// PostgreSQL: the journal itself NOTIFYs channel cairn_wake with the same
// text inside the transaction that made the change, so notify() does
// nothing; a listener holds a connection of its own that LISTENs.
//
// SQLite: one unix datagram socket per listening process, in the folder
// DB.wake beside the journal (mode 0700, created by a listener). A datagram
// is "WHAT RUN_ID" in ASCII, at most max_wakeup_bytes; anything else is
// ignored.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace cairn::storage {

// What changed about a run.
enum class change { submitted, signalled, cancel_requested, ended, child_ended, waiting, released };

inline constexpr std::size_t max_wakeup_bytes = 256;

// Tells every listener of the journal at `db` in another process that
// `what` happened to run `run_id`. Call it after the commit, and wake this
// process's own waiters directly (engine::announce does): a datagram to its
// own listener would only wake that listener's thread to do the same, on a
// run's way in. Never blocks and never throws: a listener that is gone is
// forgotten (its socket removed), a full queue drops the hint.
void notify(const std::filesystem::path& db, std::string_view run_id, change what) noexcept;

// The text of a wake-up, "WHAT RUN_ID", as a datagram or a NOTIFY carries
// it; and back, nullopt for anything else.
std::string wakeup_text(std::string_view run_id, change what);
std::optional<std::pair<std::string, change>> parse_wakeup(std::string_view text);

class wake_listener {
 public:
  // Called on the listener's own thread, for each hint heard; must not throw.
  // An empty run_id means hints may have been lost (the connection to
  // PostgreSQL was down): re-read everything.
  using callback = std::function<void(const std::string& run_id, change what)>;
  // Listens until destroyed. Throws storage_error(io) when the folder beside
  // the journal cannot be made or is not this user's own, or the PostgreSQL
  // server cannot be reached.
  wake_listener(const std::filesystem::path& db, callback on_wake);
  ~wake_listener();
  wake_listener(const wake_listener&) = delete;
  wake_listener& operator=(const wake_listener&) = delete;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cairn::storage
