#include "tests/support/pg_cluster.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cairn::testing {
namespace fs = std::filesystem;
namespace {

const char* const missing_server =
    "PostgreSQL's server programs (initdb, postgres) were not found in /usr/lib/postgresql/*/bin or on PATH: "
    "install Debian's postgresql package (make test does: scripts/install-deps.sh), or set CAIRN_PG_BIN to "
    "the folder holding them";

// The newest installed server's bin folder.
fs::path find_bin() {
  if (const char* dir = std::getenv("CAIRN_PG_BIN"); dir && *dir) {
    if (fs::exists(fs::path(dir) / "initdb")) return dir;
    throw std::runtime_error(std::string(missing_server) + " (CAIRN_PG_BIN=" + dir + " holds no initdb)");
  }
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec))
    if (fs::exists(e.path() / "bin/initdb") && fs::exists(e.path() / "bin/postgres")) found.push_back(e.path() / "bin");
  if (!found.empty()) {
    std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) {
      return std::stoi(a.parent_path().filename()) < std::stoi(b.parent_path().filename());
    });
    return found.back();
  }
  for (const char* dir : {"/usr/local/bin", "/usr/bin"})
    if (fs::exists(fs::path(dir) / "initdb") && fs::exists(fs::path(dir) / "postgres")) return dir;
  throw std::runtime_error(missing_server);
}

// PostgreSQL refuses to run as root: under root the server runs as this user.
struct server_user {
  uid_t uid;
  gid_t gid;
};
std::optional<server_user> user_for_server() {
  if (geteuid() != 0) return std::nullopt;
  for (const char* name : {"postgres", "nobody"})
    if (const passwd* pw = getpwnam(name)) return server_user{pw->pw_uid, pw->pw_gid};
  throw std::runtime_error("running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL as");
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free loopback port for PostgreSQL");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts argv with its output appended to `log`, as the server user when root;
// the child gets `death_signal` if the calling thread dies.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& log, int death_signal) {
  const auto user = user_for_server();
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setsid();  // a terminal's ^C reaches the test, not the server behind it
    int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (out < 0) _exit(126);
    dup2(out, 1);
    dup2(out, 2);
    int in = ::open("/dev/null", O_RDONLY);
    dup2(in, 0);
    if (user && (setgroups(0, nullptr) != 0 || setgid(user->gid) != 0 || setuid(user->uid) != 0)) _exit(125);
    // After setuid, which clears the death signal.
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != parent) _exit(127);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

std::string tail_of(const fs::path& log) {
  std::ifstream in(log);
  std::stringstream all;
  all << in.rdbuf();
  std::string s = all.str();
  if (s.size() > 2000) s = "..." + s.substr(s.size() - 2000);
  return s;
}

void chown_tree(const fs::path& root, uid_t uid, gid_t gid) {
  if (::chown(root.c_str(), uid, gid) != 0) throw std::runtime_error("cannot chown " + root.string());
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (::lchown(e.path().c_str(), uid, gid) != 0) throw std::runtime_error("cannot chown " + e.path().string());
}

}  // namespace

pg_cluster::pg_cluster() : bin_(find_bin()) {
  static std::atomic<int> counter{0};
  folder_ = fs::temp_directory_path() / ("cairn-pg-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(folder_);
  fs::create_directories(folder_ / "socket");
  fs::permissions(folder_, fs::perms::owner_all);
  if (auto user = user_for_server()) chown_tree(folder_, user->uid, user->gid);

  const fs::path log = folder_ / "initdb.log";
  const pid_t initdb = spawn({(bin_ / "initdb").string(), "-D", (folder_ / "data").string(), "-U", "cairn",
                              "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"},
                             log, SIGKILL);
  int status = 0;
  while (waitpid(initdb, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("initdb failed for a test cluster in " + folder_.string() + ":\n" + tail_of(log));
  port_ = free_port();
  start();
}

pg_cluster::~pg_cluster() {
  try {
    stop(false);
  } catch (...) {
  }
  std::error_code ec;
  fs::remove_all(folder_, ec);
}

std::string pg_cluster::url(const std::string& dbname) const {
  return "postgresql://cairn@127.0.0.1:" + std::to_string(port_) + "/" + dbname;
}

void pg_cluster::start() {
  if (server_ > 0) return;
  const fs::path log = folder_ / "server.log";
  // fsync stays on: the journal's durability is measured and tested against a real server.
  server_ = spawn({(bin_ / "postgres").string(), "-D", (folder_ / "data").string(), "-p", std::to_string(port_), "-c",
                   "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + (folder_ / "socket").string(),
                   "-c", "max_connections=300", "-c", "shared_buffers=64MB", "-c", "fsync=on"},
                  log, SIGQUIT);
  const std::string conninfo = url("postgres") + "?connect_timeout=5";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (PQping(conninfo.c_str()) != PQPING_OK) {
    int status = 0;
    if (waitpid(server_, &status, WNOHANG) == server_) {
      server_ = -1;
      throw std::runtime_error("the test PostgreSQL server exited while starting:\n" + tail_of(log));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop(false);
      throw std::runtime_error("the test PostgreSQL server did not accept connections within 60 s:\n" + tail_of(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void pg_cluster::stop(bool fast) {
  if (server_ <= 0) return;
  ::kill(server_, fast ? SIGINT : SIGQUIT);
  int status = 0;
  while (waitpid(server_, &status, 0) < 0 && errno == EINTR) {
  }
  server_ = -1;
}

std::string pg_cluster::fresh_database() {
  const std::string name = "cairn_test_" + std::to_string(++databases_);
  PGconn* c = PQconnectdb(url("postgres").c_str());
  std::string error;
  if (PQstatus(c) != CONNECTION_OK) {
    error = PQerrorMessage(c);
  } else {
    PGresult* r = PQexec(c, ("CREATE DATABASE " + name).c_str());
    if (PQresultStatus(r) != PGRES_COMMAND_OK) error = PQerrorMessage(c);
    PQclear(r);
  }
  PQfinish(c);
  if (!error.empty()) throw std::runtime_error("cannot create a test database: " + error);
  return url(name);
}

pg_cluster& shared_pg_cluster() {
  static pg_cluster cluster;
  return cluster;
}

}  // namespace cairn::testing
