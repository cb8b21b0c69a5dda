#include <poll.h>

#include <array>
#include <cerrno>

#include <fmt/format.h>

#include "storage/postgres/libpq.hpp"
#include "storage/postgres/postgres_journal.hpp"

namespace cairn::storage::postgres {

postgres_listener::postgres_listener(const std::string& url) : url_(url) {
  if (!connect())
    throw storage_error(errc::io, fmt::format("cannot listen for wake-ups on {} ({}); is the server running? check --db",
                                              without_password(url), conn_ ? trimmed(PQerrorMessage(conn_)) : "out of memory"));
}

postgres_listener::~postgres_listener() { PQfinish(conn_); }

bool postgres_listener::connect() {
  if (conn_) PQreset(conn_);
  else conn_ = connect_to(url_);
  if (PQstatus(conn_) != CONNECTION_OK) return false;
  std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn_, fmt::format("LISTEN {}", wake_channel).c_str()),
                                                  &PQclear);
  return PQresultStatus(r.get()) == PGRES_COMMAND_OK && PQsetnonblocking(conn_, 1) == 0;
}

void postgres_listener::listen(int stop_fd, const std::function<void(const std::string&, change)>& on_wake) {
  bool connected = true;
  for (;;) {
    std::array<pollfd, 2> fds{pollfd{stop_fd, POLLIN, 0}, pollfd{connected ? PQsocket(conn_) : -1, POLLIN, 0}};
    // Lost: look again in a second, for as long as it takes.
    if (::poll(fds.data(), fds.size(), connected ? -1 : 1000) < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    if (!connected) {
      if ((connected = connect())) on_wake(std::string(), change::submitted);
      continue;
    }
    if (!fds[1].revents) continue;
    if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) != CONNECTION_OK) {
      connected = false;
      continue;
    }
    while (PGnotify* n = PQnotifies(conn_)) {
      if (auto hint = parse_wakeup(n->extra)) on_wake(hint->first, hint->second);
      PQfreemem(n);
    }
  }
}

}  // namespace cairn::storage::postgres
