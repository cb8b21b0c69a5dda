// A private, throwaway PostgreSQL cluster for tests: initdb in a fresh
// temporary folder, the server started on a free loopback port (and a unix
// socket in that folder), trust authentication for the superuser "cairn".
// Never a system service: the server is this process's child, run as the user
// "postgres" (or "nobody") when the test runs as root, since PostgreSQL
// refuses to run as root. It gets SIGQUIT if the thread that started it dies,
// so a killed test leaves no server behind; the folder is removed on exit.
//
// Without PostgreSQL's server programs (Debian's postgresql package) every
// call throws std::runtime_error saying what to install: a test that needs a
// server fails, it never skips.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace cairn::testing {

class pg_cluster {
 public:
  // Makes the cluster and starts it; throws std::runtime_error with the
  // server's log when it cannot.
  pg_cluster();
  ~pg_cluster();
  pg_cluster(const pg_cluster&) = delete;
  pg_cluster& operator=(const pg_cluster&) = delete;

  int port() const { return port_; }
  // postgresql://cairn@127.0.0.1:PORT/DBNAME
  std::string url(const std::string& dbname = "postgres") const;
  // Creates a new empty database and returns its URL: one per test keeps
  // tests apart on one server.
  std::string fresh_database();

  // Stops the server: `fast` as an administrator would (clients are
  // disconnected, the shutdown checkpoint written), otherwise at once
  // (SIGQUIT, crash recovery at the next start). start() starts it again on
  // the same port with the same data.
  void stop(bool fast = true);
  void start();
  void restart() {
    stop();
    start();
  }
  bool running() const { return server_ > 0; }
  pid_t server_pid() const { return server_; }
  const std::filesystem::path& folder() const { return folder_; }

 private:
  std::filesystem::path bin_, folder_;
  int port_ = 0;
  pid_t server_ = -1;
  int databases_ = 0;
};

// One cluster for the whole test process, made at the first call.
pg_cluster& shared_pg_cluster();

}  // namespace cairn::testing
