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

namespace cairn::runtime {

// The filter compiled to BPF. Throws sandbox_error if libseccomp fails.
const std::string& seccomp_program();

}  // namespace cairn::runtime
