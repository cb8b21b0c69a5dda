// The seccomp filter every bwrap sandbox runs under, as a BPF program for
// bwrap's --seccomp. Denied with EPERM: kernel interfaces an agent never needs
// and that widen the attack surface (ptrace, mount, namespaces, keyrings, bpf,
// io_uring, module loading, ...), creating any socket (the agent's only
// channel is the one it inherits on fd 3), namespace flags on clone, and
// TIOCSTI/TIOCLINUX. clone3 answers ENOSYS so libc falls back to clone,
// whose flags can be checked. Syscalls of another architecture kill the
// process.
#pragma once

#include <string>
#include <vector>

namespace cairn::runtime {

// The filter compiled to BPF. Throws sandbox_error if libseccomp fails.
const std::string& seccomp_program();

// One call the filter refuses, and the errno it answers instead.
struct seccomp_denial {
  std::string name;  // "ptrace"; "clone:CLONE_NEWUSER" (clone with that flag); "ioctl:TIOCSTI"
  int error;         // EPERM, or ENOSYS for clone3
};

// Everything the filter refuses on this architecture (syscalls it lacks are
// left out), so that tests can try each one.
std::vector<seccomp_denial> seccomp_denials();

}  // namespace cairn::runtime
