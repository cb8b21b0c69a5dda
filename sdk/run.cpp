#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <sys/socket.h>
#include <sys/stat.h>

#include "session.hpp"

namespace cairn {
namespace {

// To the agent's stderr, the run's log. C stdio, not iostreams: an agent
// that uses no iostream of its own starts without their and the C++
// locale's initialization (a quarter of its page faults from exec to exit).
void say(std::string_view what, std::string_view detail = {}) {
  std::fwrite(what.data(), 1, what.size(), stderr);
  std::fwrite(detail.data(), 1, detail.size(), stderr);
  std::fputc('\n', stderr);
}

protocol::fail_msg failure(std::string message, std::string type) {
  return protocol::fail_msg{protocol::error_info{std::move(message), std::move(type)}};
}

}  // namespace

int run(int channel_fd, const workflow& fn) {
  std::unique_ptr<session> s;
  try {
    s = std::make_unique<session>(channel_fd);
  } catch (const std::exception& e) {
    say("cairn agent: ", e.what());
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
      say("cairn agent: run failed: ", failed->error.message);
      return 1;
    }
    s->send(protocol::done_msg{std::move(output)});
    s->close_channel();
    return 0;
  } catch (const std::exception& e) {
    // The host is gone or broke the protocol: the run's fate is the host's
    // to decide from its journal, so just stop.
    say("cairn agent: ", e.what());
    return 3;
  }
}

int main(int, char**, const workflow& fn) {
  const char* env = std::getenv("CAIRN_CHANNEL_FD");
  int fd = env ? std::atoi(env) : 3;
  struct stat st {};
  if (!env || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
    say("This is a cairn agent; start it with `cairn run PROGRAM --input JSON`.");
    return 2;
  }
  return run(fd, fn);
}

}  // namespace cairn
