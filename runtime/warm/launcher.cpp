// cairn's launcher: the first program of a pooled (warm) sandbox. It waits,
// without any privilege, for the run that takes the sandbox, then becomes
// that run's agent. See launch.hpp for what it reads; on any error it says
// why on stderr (the pool's log) and exits 127. Linked static-pie (see
// runtime/CMakeLists.txt): nothing to load before it runs.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/warm/launch.hpp"

namespace {

constexpr int channel_fd = 3;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "cairn launcher: %s: %s\n", what, std::strerror(errno));
  std::_Exit(127);
}

bool read_exactly(char* data, std::size_t size) {
  for (std::size_t got = 0; got < size;) {
    ssize_t n = ::read(channel_fd, data + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

// The NUL-terminated strings from `at` up to an empty one; null-terminated.
std::vector<char*> strings(char*& at, const char* end) {
  std::vector<char*> list;
  while (at < end && *at) {
    list.push_back(at);
    at += std::strlen(at) + 1;
  }
  ++at;
  list.push_back(nullptr);
  return list;
}

}  // namespace

int main() {
  char ready = cairn::runtime::warm::launcher_ready;
  while (::write(channel_fd, &ready, 1) < 0)
    if (errno != EINTR) fail("telling the host the sandbox is ready");

  std::uint32_t length = 0;
  int fds[2] = {-1, -1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)];
  iovec iov{&length, sizeof length};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = ::recvmsg(channel_fd, &message, MSG_WAITALL)) < 0 && errno == EINTR) {
  }
  if (n == 0) std::_Exit(0);  // the host took the sandbox down unused
  if (n != sizeof length) fail("reading the launch message");
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (!header || header->cmsg_type != SCM_RIGHTS || header->cmsg_len != CMSG_LEN(sizeof fds)) {
    errno = EPROTO;
    fail("the launch message carries no program and log");
  }
  std::memcpy(fds, CMSG_DATA(header), sizeof fds);
  if (length == 0 || length > cairn::runtime::warm::max_launch_bytes) {
    errno = EMSGSIZE;
    fail("the launch message's length");
  }
  std::vector<char> body(length + 2, '\0');  // two NULs past the end: unterminated lists still end
  if (!read_exactly(body.data(), length)) fail("reading the launch message");
  char* at = body.data();
  const char* end = body.data() + length;
  std::vector<char*> argv = strings(at, end);
  std::vector<char*> envp = strings(at, end);
  if (argv.size() < 2) {
    errno = EPROTO;
    fail("the launch message names no program");
  }

  const int program = fds[0], log = fds[1];
  if (::dup2(log, 1) < 0 || ::dup2(log, 2) < 0) fail("taking the run's log as stdout and stderr");
  ::close(log);
  // The host mounted the run's workspace over /workspace after this process entered it.
  if (::chdir("/workspace") < 0) fail("entering /workspace");
  // A script's interpreter reads it as /dev/fd/N: only then it stays open.
  char magic[2] = {};
  if (::pread(program, magic, sizeof magic, 0) != 2 || magic[0] != '#' || magic[1] != '!')
    ::fcntl(program, F_SETFD, FD_CLOEXEC);
  ::syscall(SYS_execveat, program, "", argv.data(), envp.data(), AT_EMPTY_PATH);
  fail("executing the agent");
}
