#include "runtime/warm_pool.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime/bwrap_support.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/process_tree.hpp"
#include "runtime/tree_copy.hpp"
#include "runtime/warm/launch.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr const char* warm_record_kind = "warm";
// Each maker thread runs a bwrap start at a time; two keep a pool of a few
// dozen full while runs take from it, without crowding the cold starts.
constexpr std::size_t max_makers = 2;

[[noreturn]] void failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

// The log a pooled folder comes with.
fs::path log_beside(const fs::path& folder) { return fs::path(folder) += ".log"; }

// Whether `path` is a folder (not a link) that holds nothing.
bool empty_folder(const fs::path& path) {
  unique_fd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  try {
    return dir && !has_entries(dir.get());
  } catch (const sandbox_error&) {
    return false;  // it cannot be listed
  }
}

// A pooled sandbox whose launcher waits for whichever agent a run brings.
bool waits(const std::unique_ptr<warm_sandbox>& w) { return !w->agent; }

// Removes the folder; an agent started in it may have left files there,
// in folders it made unwritable (clear_tree lets the owner back in). Its
// processes are gone by then.
bool remove_folder(const fs::path& path) {
  if (::rmdir(path.c_str()) == 0) return true;
  if (errno != ENOTEMPTY) return false;
  unique_fd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return false;
  try {
    ::fchmod(dir.get(), 0700);
    clear_tree(dir.get(), path);
  } catch (const sandbox_error&) {
    return false;
  }
  return ::rmdir(path.c_str()) == 0;
}

// Every mount stacked on `path` (the folder's own, a run's workspace on it).
void unmount_all(const fs::path& path) {
  for (int i = 0; i < 8 && ::umount2(path.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0; ++i) {
  }
}

// The CPU time each of `sandboxes` has used: its cgroup's total, else what
// /proc shows under its bwrap (one scan for all); nullopt for one that has
// neither (a test's).
std::vector<std::optional<std::chrono::nanoseconds>> cpu_times(const std::vector<warm_sandbox*>& sandboxes) {
  std::vector<std::optional<std::chrono::nanoseconds>> out(sandboxes.size());
  std::vector<pid_t> roots;
  std::vector<std::size_t> rooted;  // which of `sandboxes` each root is
  for (std::size_t i = 0; i < sandboxes.size(); ++i) {
    const auto& w = *sandboxes[i];
    if (w.cgroup) {
      out[i] = std::chrono::nanoseconds(w.cgroup->counters().cpu_ns);
    } else if (w.handle) {
      std::lock_guard lock(w.handle->mutex);
      if (w.handle->pid > 0 && !w.handle->status) {  // unreaped: its pid is not anyone else's
        roots.push_back(w.handle->pid);
        rooted.push_back(i);
      }
    }
  }
  auto times = tree_cpu_times(roots);
  for (std::size_t j = 0; j < rooted.size(); ++j) out[rooted[j]] = times[j];
  return out;
}

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// Waits for a change, or until `t` (steady_clock's max: no time).
void wait_until(std::condition_variable& changed, std::unique_lock<std::mutex>& lock,
                std::chrono::steady_clock::time_point t) {
  if (t == std::chrono::steady_clock::time_point::max())
    changed.wait(lock);
  else
    changed.wait_until(lock, t);
}

void send_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed("handing the agent to its pooled sandbox");
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

warm_folder::warm_folder(fs::path path, bool shared_mount)
    : path_(std::move(path)), log_path_(log_beside(path_)), shared_mount_(shared_mount) {
  record_ = std::make_unique<own_record>(warm_record_kind, host_identity() + "\n" + path_.string());
  // A run's log, made ahead as the run's folder is: making a file costs a
  // run's way in 0.1-0.2 ms on this project's VM.
  log_.reset(::open(log_path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!log_ || ::fchmod(log_.get(), 0600) < 0) failed("making " + log_path_.string());
  // Root's is read-only to the sandbox uid until a workspace is mounted on it.
  const mode_t mode = shared_mount_ ? 0755 : 0700;
  if (::mkdir(path_.c_str(), mode) < 0 || ::chmod(path_.c_str(), mode) < 0) {
    int saved = errno;
    ::unlink(log_path_.c_str());
    errno = saved;
    failed("making " + path_.string());
  }
  if (!shared_mount_) return;
  // Private first, so that it leaves the peer group of the mount it sits on.
  if (::mount(path_.c_str(), path_.c_str(), nullptr, MS_BIND, nullptr) < 0 ||
      ::mount(nullptr, path_.c_str(), nullptr, MS_PRIVATE, nullptr) < 0 ||
      ::mount(nullptr, path_.c_str(), nullptr, MS_SHARED, nullptr) < 0) {
    int saved = errno;
    unmount_all(path_);
    ::rmdir(path_.c_str());
    ::unlink(log_path_.c_str());
    errno = saved;
    failed("making " + path_.string() + " a shared mount");
  }
}

warm_folder::~warm_folder() {
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
  if (kept_) return;
  if (shared_mount_) unmount_all(path_);
  remove_folder(path_);
}

void warm_folder::show(const fs::path& workspace) {
  if (::mount(workspace.c_str(), path_.c_str(), nullptr, MS_BIND, nullptr) < 0)
    failed(fmt::format("mounting workspace {} into its pooled sandbox", workspace.string()));
}

bool warm_folder::become(const fs::path& workspace) {
  if (shared_mount_) return false;
  // A new run's workspace is not there yet: the folder moves into its place,
  // and no folder is made or freed on the run's way (on this project's VM,
  // whose ext4 has no journal, each costs 0.1-0.5 ms).
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, workspace.c_str(), RENAME_NOREPLACE) == 0) return true;
  // An empty one is swapped with the folder, not replaced by it, which would
  // free it there and then. It goes with this object, at the sandbox's end,
  // and with its record after a crash.
  if (errno != EEXIST || ::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, workspace.c_str(), RENAME_EXCHANGE) < 0)
    return false;
  if (empty_folder(path_)) return true;
  // Something came into the workspace meanwhile, or it is no folder: as a rename would have, refuse.
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, workspace.c_str(), RENAME_EXCHANGE) < 0) {
    // What was the workspace stays at path_, never removed: not by this object, nor by a sweep.
    kept_ = true;
    record_.reset();
    failed(fmt::format("putting {} back after a pooled sandbox could not take its place (it is at {})",
                       workspace.string(), path_.string()));
  }
  return false;
}

unique_fd warm_folder::give_log(const fs::path& log_file) {
  if (log_path_.empty() || log_file.empty()) return {};
  const fs::path run_log = fs::absolute(log_file).lexically_normal();
  unique_fd folder = open_folder_no_follow(run_log.parent_path(), 0700);
  if (::renameat2(AT_FDCWD, log_path_.c_str(), folder.get(), run_log.filename().c_str(), RENAME_NOREPLACE) < 0)
    return {};
  log_path_.clear();
  return std::move(log_);
}

warm_sandbox::~warm_sandbox() {
  if (handle) end_child(*handle);
  channel.reset();
  if (cgroup) cgroup->remove();
  // After its processes: nothing holds the mounts any more.
  image.reset();
  if (!image_path.empty()) {
    ::unlink(image_path.c_str());
    ::unlink(attached_marker(image_path).c_str());
  }
  folder.reset();
}

void warm_sandbox::launch(int program, int log_writer, const std::vector<std::string>& argv,
                          const std::vector<std::string>& env) {
  std::string body;
  for (const auto* list : {&argv, &env}) {
    for (const auto& s : *list) body.append(s).push_back('\0');
    body.push_back('\0');
  }
  if (body.size() > warm::max_launch_bytes)
    throw sandbox_error(sandbox_errc::bad_spec, fmt::format("the agent's arguments and environment take {} bytes, "
                                                            "more than the {} a pooled sandbox accepts",
                                                            body.size(), warm::max_launch_bytes));
  const auto length = static_cast<std::uint32_t>(body.size());
  int fds[2] = {program, log_writer};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{const_cast<std::uint32_t*>(&length), sizeof length};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(header), fds, sizeof fds);
  ssize_t sent;
  while ((sent = ::sendmsg(channel.get(), &message, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (sent < 0) failed("handing the agent to its pooled sandbox");
  // A socket takes 4 bytes whole: sendmsg sent the length or nothing.
  send_all(channel.get(), body.data(), body.size());
}

warm_pool::warm_pool(std::size_t size, maker make, bool start_agents, std::chrono::milliseconds refused_pause)
    : size_(size), make_(std::move(make)), start_agents_(start_agents), refused_pause_(refused_pause) {
  for (std::size_t i = 0; i < std::min(size_, max_makers); ++i) threads_.emplace_back([this] { fill(); });
}

warm_pool::~warm_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : threads_) t.join();
  ready_.clear();
}

std::unique_ptr<warm_sandbox> warm_pool::take(const std::shared_ptr<const warm_agent>& agent, bool launcher_will_do) {
  std::lock_guard lock(mutex_);
  const auto runs = [&](const auto& w) { return agent && w->agent && *w->agent == *agent; };
  const bool resting = agent && refused_ && *refused_ == *agent && std::chrono::steady_clock::now() < refused_until_;
  if (start_agents_ && agent && !(wanted_ && *wanted_ == *agent) && !resting) {
    wanted_ = agent;
    changed_.notify_all();  // the fillers destroy what runs another
  }
  auto it = std::find_if(ready_.begin(), ready_.end(), runs);
  if (it == ready_.end() && launcher_will_do) it = std::find_if(ready_.begin(), ready_.end(), waits);
  if (it == ready_.end()) return nullptr;
  auto taken = std::move(*it);
  ready_.erase(it);
  last_take_ = std::chrono::steady_clock::now();
  changed_.notify_all();
  return taken;
}

bool warm_pool::wait_ready(std::size_t count, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    const auto launchers = static_cast<std::size_t>(std::count_if(ready_.begin(), ready_.end(), waits));
    const auto running = static_cast<std::size_t>(std::count_if(ready_.begin(), ready_.end(), [&](const auto& w) {
      return w->agent && wanted_ && *w->agent == *wanted_;
    }));
    return running + std::min(launchers, launchers_kept()) >= count;
  });
}

std::size_t warm_pool::launchers_kept() const { return wanted_ ? size_ / 4 : size_; }

std::deque<std::unique_ptr<warm_sandbox>>::iterator warm_pool::stale() {
  // A sandbox running an agent no run asks for any more serves nobody; those
  // whose launcher waits give way to ones running the agent asked for, but
  // for a quarter of the pool, kept for runs that cannot take those.
  auto it = std::find_if(ready_.begin(), ready_.end(),
                         [&](const auto& w) { return w->agent && !(wanted_ && *w->agent == *wanted_); });
  if (it != ready_.end()) return it;
  if (static_cast<std::size_t>(std::count_if(ready_.begin(), ready_.end(), waits)) > launchers_kept())
    return std::find_if(ready_.begin(), ready_.end(), waits);
  return ready_.end();
}

std::optional<std::string> warm_pool::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

std::chrono::milliseconds warm_pool::refuse_locked(const std::shared_ptr<const warm_agent>& agent) {
  refusals_ = refused_ && *refused_ == *agent ? refusals_ + 1 : 1;
  refused_ = agent;
  const auto pause = std::min<std::chrono::milliseconds>(refused_pause_ * (1 << std::min(refusals_ - 1, 12)),
                                                         std::chrono::hours(1));
  refused_until_ = std::chrono::steady_clock::now() + pause;
  if (wanted_ && *wanted_ == *agent) wanted_.reset();
  return pause;
}

void warm_pool::end_busy_agents(std::unique_lock<std::mutex>& lock) {
  std::vector<warm_sandbox*> waiting;
  for (const auto& w : ready_)
    if (w->agent) waiting.push_back(w.get());
  // Under the lock, so that no run takes one meanwhile: a cgroup's counters
  // are a read of a file held open; /proc is one scan for all.
  const auto used = cpu_times(waiting);
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<warm_sandbox>> ended;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    if (!used[i]) continue;
    auto& w = *waiting[i];
    const auto idle = now - w.ready_at;
    const auto spent = *used[i] - w.cpu_at_ready;
    if (spent <= idle_cpu_allowance + idle * idle_cpu_percent / 100) continue;
    // Refused once for all its sandboxes ended now: the pause doubles per refusal.
    const bool resting = refused_ && *refused_ == *w.agent && now < refused_until_;
    const auto pause = resting ? std::chrono::duration_cast<std::chrono::milliseconds>(refused_until_ - now)
                               : refuse_locked(w.agent);
    last_error_ = fmt::format("agent {} used {:.1f} s of CPU in the {:.1f} s it waited for a run in a pooled "
                              "sandbox, more than a waiting agent may ({} ms, and {}% of one CPU): ended, and not "
                              "started ahead for {} s",
                              w.agent->program.string(), seconds(spent), seconds(idle), idle_cpu_allowance.count(),
                              idle_cpu_percent, std::chrono::duration_cast<std::chrono::seconds>(pause).count());
    auto it = std::find_if(ready_.begin(), ready_.end(), [&](const auto& r) { return r.get() == &w; });
    ended.push_back(std::move(*it));
    ready_.erase(it);
  }
  const bool any_waits = std::any_of(ready_.begin(), ready_.end(), [](const auto& w) { return w->agent != nullptr; });
  next_idle_check_ = any_waits ? now + idle_check_interval : std::chrono::steady_clock::time_point::max();
  if (ended.empty()) return;
  changed_.notify_all();
  lock.unlock();
  ended.clear();  // kills and reaps each, with all its processes
  lock.lock();
}

void warm_pool::fill() {
  using clock = std::chrono::steady_clock;
  std::unique_lock lock(mutex_);
  auto pause = std::chrono::seconds(1);
  clock::time_point paused_until{};  // after a failure to make one
  while (!stopping_) {
    if (clock::now() >= next_idle_check_) {
      end_busy_agents(lock);
      continue;
    }
    if (auto gone = stale(); gone != ready_.end()) {
      auto dropped = std::move(*gone);
      ready_.erase(gone);
      lock.unlock();
      dropped.reset();
      lock.lock();
      continue;
    }
    if (ready_.size() + making_ >= size_) {
      wait_until(changed_, lock, next_idle_check_);
      continue;
    }
    if (clock::now() < paused_until) {
      wait_until(changed_, lock, std::min(paused_until, next_idle_check_));
      continue;
    }
    if (const auto due = last_take_ + refill_delay; !ready_.empty() && clock::now() < due) {
      changed_.wait_until(lock, due, [&] { return stopping_; });
      continue;
    }
    // Sandboxes running the agent asked for, but for the launchers kept.
    const auto launchers =
        static_cast<std::size_t>(std::count_if(ready_.begin(), ready_.end(), waits)) + making_launchers_;
    const auto agent = launchers < launchers_kept() ? nullptr : wanted_;
    ++making_;
    making_launchers_ += !agent;
    lock.unlock();
    std::unique_ptr<warm_sandbox> made;
    std::string error;
    try {
      made = make_(agent);
      if (made && made->agent) {
        made->ready_at = clock::now();
        made->cpu_at_ready = cpu_times({made.get()})[0].value_or(std::chrono::nanoseconds(0));
      }
    } catch (const std::exception& e) {
      made.reset();
      error = e.what();
    }
    lock.lock();
    --making_;
    making_launchers_ -= !agent;
    if (!made && agent) {
      // An agent that does not start in a pooled sandbox starts cold (or
      // from a launcher); the pool goes on without it for a while.
      refuse_locked(agent);
      last_error_ = error;
      continue;
    }
    // Started after its pause: no longer refused. One that was being made
    // when it was refused (it spun while it waited, say) stays refused.
    if (made && agent && refused_ && *refused_ == *agent && clock::now() >= refused_until_) {
      refused_.reset();
      refusals_ = 0;
    }
    if (made) {
      if (made->agent && next_idle_check_ == clock::time_point::max())
        next_idle_check_ = made->ready_at + idle_check_interval;
      ready_.push_back(std::move(made));
      if (agent || !refused_) last_error_.reset();  // why an agent is not started ahead stays told
      pause = std::chrono::seconds(1);
      changed_.notify_all();
      continue;
    }
    // A machine that cannot make one now (bwrap broken, no memory) is not
    // asked again at once: runs start cold meanwhile.
    last_error_ = error;
    paused_until = clock::now() + pause;
    pause = std::min(pause * 2, std::chrono::seconds(30));
  }
}

std::size_t sweep_orphaned_warm_folders() {
  std::size_t swept = 0;
  for (const auto& record : own_records(warm_record_kind)) {
    auto newline = record.subject.find('\n');
    if (newline == std::string::npos || host_alive(record.subject.substr(0, newline))) continue;
    const fs::path folder = record.subject.substr(newline + 1);
    unmount_all(folder);
    ::unlink(log_beside(folder).c_str());
    const fs::path image = fs::path(folder) += ".img";
    ::unlink(image.c_str());
    ::unlink(attached_marker(image).c_str());
    if (remove_folder(folder)) ++swept;
    forget_record(record);
  }
  return swept;
}

}  // namespace cairn::runtime
