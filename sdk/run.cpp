#include <cstdlib>
#include <iostream>
#include <sys/socket.h>
#include <sys/stat.h>

#include "session.hpp"

namespace cairn {
namespace {

protocol::fail_msg failure(std::string message, std::string type) {
  return protocol::fail_msg{protocol::error_info{std::move(message), std::move(type)}};
}

}  // namespace

int run(int channel_fd, const workflow& fn) {
  std::unique_ptr<session> s;
  try {
    s = std::make_unique<session>(channel_fd);
  } catch (const std::exception& e) {
    std::cerr << "cairn agent: " << e.what() << "\n";
    return 2;
  }
  try {
    context ctx(*s);
    json output;
    std::optional<protocol::fail_msg> failed;
    try {
      output = fn(ctx, s->start().input);
    } catch (const nondeterminism& n) {
      failed = failure(n.message, "nondeterminism");
    } catch (const step_failed& e) {
      failed = failure(e.what(), e.type());
    } catch (const child_failed& e) {
      failed = failure(e.what(), e.type());
    } catch (const host_gone&) {
      throw;
    } catch (const std::exception& e) {
      failed = failure(e.what(), "error");
    } catch (...) {
      failed = failure("the workflow threw a non-standard exception", "unknown");
    }
    // A workflow that swallowed a non-determinism error still fails.
    if (!failed && s->nondeterminism_error()) failed = failure(*s->nondeterminism_error(), "nondeterminism");
    // A cancelled run ends as cancelled however the workflow ended, even if a
    // cancel arrived only after its last ctx call.
    s->poll();
    if (s->cancel_reason()) failed = failure(*s->cancel_reason(), "cancelled");
    if (failed) {
      s->send(*failed);
      s->close_channel();
      std::cerr << "cairn agent: run failed: " << failed->error.message << "\n";
      return 1;
    }
    s->send(protocol::done_msg{std::move(output)});
    s->close_channel();
    return 0;
  } catch (const std::exception& e) {
    // The host is gone or broke the protocol: the run's fate is the host's
    // to decide from its journal, so just stop.
    std::cerr << "cairn agent: " << e.what() << "\n";
    return 3;
  }
}

int main(int, char**, const workflow& fn) {
  const char* env = std::getenv("CAIRN_CHANNEL_FD");
  int fd = env ? std::atoi(env) : 3;
  struct stat st {};
  if (!env || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
    std::cerr << "This is a cairn agent; start it with `cairn run PROGRAM --input JSON`.\n";
    return 2;
  }
  return run(fd, fn);
}

}  // namespace cairn
