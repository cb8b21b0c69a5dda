// cairn's launcher: the first program of a pooled (warm) sandbox. It waits,
// without any privilege, for the run that takes the sandbox, then becomes
// that run's agent. See launch.hpp for what it reads; on any error it says
// why on stderr (the pool's log) and exits 127.
//
// Freestanding: no C library, its own entry point and system calls (x86-64
// and arm64), no relocations (see runtime/CMakeLists.txt). Every pooled
// sandbox has bwrap copy the launcher into its /run/cairn and then maps
// it: 10 KB here, against 870 KB for the smallest static C library build.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "runtime/warm/launch.hpp"

namespace {

constexpr int channel_fd = 3;

// A system call: its result, or -errno.
long raw_call(long number, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
#if defined(__x86_64__)
  long result;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(result)
                   : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return result;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = number;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
  return x0;
#else
#error "the freestanding launcher knows the system calls of x86-64 and arm64 only"
#endif
}

// An argument as the register that carries it.
template <typename T>
long word(T value) {
  if constexpr (std::is_pointer_v<T>)
    return reinterpret_cast<long>(value);
  else
    return static_cast<long>(value);
}

template <typename... Args>
long sys(long number, Args... args) {
  return raw_call(number, word(args)...);
}

// Retried while interrupted by a signal.
template <typename... Args>
long call(long number, Args... args) {
  long result;
  while ((result = sys(number, args...)) == -EINTR) {
  }
  return result;
}

std::size_t length_of(const char* text) {
  std::size_t n = 0;
  while (text[n]) ++n;
  return n;
}

void say(const char* text) { call(SYS_write, 2, text, length_of(text)); }

// The errors a launch can meet, by name; others by number.
const char* error_name(long error) {
  switch (error) {
    case EPERM: return "Operation not permitted";
    case ENOENT: return "No such file or directory";
    case EIO: return "Input/output error";
    case E2BIG: return "Argument list too long";
    case ENOEXEC: return "Exec format error";
    case EBADF: return "Bad file descriptor";
    case ENOMEM: return "Cannot allocate memory";
    case EACCES: return "Permission denied";
    case EFAULT: return "Bad address";
    case ENOTDIR: return "Not a directory";
    case EISDIR: return "Is a directory";
    case EINVAL: return "Invalid argument";
    case EMFILE: return "Too many open files";
    case ETXTBSY: return "Text file busy";
    case ELOOP: return "Too many levels of symbolic links";
    case EPROTO: return "Protocol error";
    case EMSGSIZE: return "Message too long";
    case ENOTSOCK: return "Socket operation on non-socket";
    case ECONNRESET: return "Connection reset by peer";
    default: return nullptr;
  }
}

[[noreturn]] void fail(const char* what, long error) {
  say("cairn launcher: ");
  say(what);
  say(": ");
  if (const char* name = error_name(error)) {
    say(name);
  } else {
    char digits[24];
    char* at = digits + sizeof digits;
    *--at = '\0';
    for (unsigned long n = static_cast<unsigned long>(error); at == digits + sizeof digits - 1 || n; n /= 10)
      *--at = static_cast<char>('0' + n % 10);
    say("error ");
    say(at);
  }
  say("\n");
  for (;;) sys(SYS_exit_group, 127);
}

bool read_exactly(char* data, std::size_t size) {
  for (std::size_t got = 0; got < size;) {
    long n = call(SYS_read, channel_fd, data + got, size - got);
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

void* map(std::size_t bytes) {
  long at = sys(SYS_mmap, 0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at < 0 && at > -4096) fail("making room for the launch message", -at);
  return reinterpret_cast<void*>(at);
}

// The NUL-terminated strings from `at` up to an empty one, as a
// null-terminated array; `at` moves past the empty one.
char** strings(char*& at, const char* end) {
  std::size_t count = 0;
  for (const char* s = at; s < end && *s; s += length_of(s) + 1) ++count;
  auto** list = static_cast<char**>(map((count + 1) * sizeof(char*)));  // zeroed: null-terminated
  for (std::size_t i = 0; i < count; ++i) {
    list[i] = at;
    at += length_of(at) + 1;
  }
  ++at;
  return list;
}

}  // namespace

extern "C" [[noreturn]] void launcher_main() {
  const char ready = cairn::runtime::warm::launcher_ready;
  if (long n = call(SYS_write, channel_fd, &ready, 1); n < 0) fail("telling the host the sandbox is ready", -n);

  std::uint32_t length = 0;
  int fds[2] = {-1, -1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)];
  iovec iov{&length, sizeof length};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const long n = call(SYS_recvmsg, channel_fd, &message, MSG_WAITALL);
  if (n == 0) sys(SYS_exit_group, 0);  // the host took the sandbox down unused
  if (n < 0) fail("reading the launch message", -n);
  if (n != sizeof length) fail("reading the launch message", EPROTO);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (!header || header->cmsg_type != SCM_RIGHTS || header->cmsg_len != CMSG_LEN(sizeof fds))
    fail("the launch message carries no program and log", EPROTO);
  __builtin_memcpy(fds, CMSG_DATA(header), sizeof fds);
  if (length == 0 || length > cairn::runtime::warm::max_launch_bytes) fail("the launch message's length", EMSGSIZE);
  // Two NULs past the end (the mapping comes zeroed): unterminated lists still end.
  char* body = static_cast<char*>(map(length + 2));
  if (!read_exactly(body, length)) fail("reading the launch message", EPROTO);
  char* at = body;
  const char* end = body + length;
  char** argv = strings(at, end);
  char** envp = strings(at, end);
  if (!argv[0]) fail("the launch message names no program", EPROTO);

  const int program = fds[0], log = fds[1];
  if (long r = sys(SYS_dup3, log, 1, 0); r < 0) fail("taking the run's log as stdout", -r);
  if (long r = sys(SYS_dup3, log, 2, 0); r < 0) fail("taking the run's log as stderr", -r);
  sys(SYS_close, log);
  // The host mounted the run's workspace over /workspace after this process entered it.
  if (long r = sys(SYS_chdir, "/workspace"); r < 0) fail("entering /workspace", -r);
  // A script's interpreter reads it as /dev/fd/N: only then it stays open.
  char magic[2] = {};
  if (call(SYS_pread64, program, magic, sizeof magic, 0) != 2 || magic[0] != '#' || magic[1] != '!')
    sys(SYS_fcntl, program, F_SETFD, FD_CLOEXEC);
  const long r = sys(SYS_execveat, program, "", argv, envp, AT_EMPTY_PATH);
  fail("executing the agent", -r);
}

// The entry point: the stack aligned for a call, no frame to return to.
#if defined(__x86_64__)
__asm__(".text\n.global _start\n.type _start,@function\n_start:\n  xor %ebp, %ebp\n  and $-16, %rsp\n"
        "  call launcher_main\n  hlt\n");
#elif defined(__aarch64__)
__asm__(".text\n.global _start\n.type _start,%function\n_start:\n  mov x29, #0\n  mov x30, #0\n  mov x0, sp\n"
        "  and sp, x0, #-16\n  bl launcher_main\n  brk #0\n");
#endif

// What a compiler may call for a struct's copy or zeroing, even freestanding.
extern "C" void* memset(void* dest, int value, std::size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dest);
  while (n--) *d++ = static_cast<unsigned char>(value);
  return dest;
}
extern "C" void* memcpy(void* dest, const void* src, std::size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dest);
  const auto* s = static_cast<const unsigned char*>(src);
  while (n--) *d++ = *s++;
  return dest;
}
