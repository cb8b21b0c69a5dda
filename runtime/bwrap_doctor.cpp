// `cairn doctor` for the bwrap backend, and the translation of bwrap's own
// start-up errors into causes and fixes.
#include <pwd.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/bwrap_support.hpp"
#include "runtime/cgroup.hpp"
#include "runtime/own_records.hpp"
#include "runtime/workspace_quota.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

std::string join_fixes(const std::vector<userns_blocker>& blockers) {
  std::string fixes;
  for (const auto& b : blockers) fixes += (fixes.empty() ? "run `" : "`, then `") + b.fix;
  return fixes + "`";
}

// The last line of `text` that bwrap wrote about itself ("bwrap: ...").
std::optional<std::string> bwrap_line(const std::string& text) {
  auto at = text.rfind("bwrap: ");
  if (at == std::string::npos) return std::nullopt;
  auto end = text.find('\n', at);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

bool contains(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

doctor_check check_installed(const std::optional<fs::path>& bwrap) {
  doctor_check c{"bwrap installed", false, "", ""};
  if (!bwrap) {
    c.detail = "bwrap was not found on PATH";
    c.fix =
        "apt-get install bubblewrap (or dnf install bubblewrap), or pass --sandbox none to run WITHOUT "
        "isolation";
    return c;
  }
  auto version = bwrap_version(*bwrap);
  if (!version) {
    c.detail = fmt::format("{} does not answer `bwrap --version`", bwrap->string());
    c.fix = "reinstall it: apt-get install --reinstall bubblewrap";
    return c;
  }
  c.ok = true;
  c.detail = fmt::format("{} (bubblewrap {})", bwrap->string(), *version);
  bwrap_features features = bwrap_features_of(*version);
  if (!features.disable_userns)
    c.detail += "; older than 0.8.0, so sandboxes may create nested user namespaces";
  if (!features.tmpfs_size) c.detail += "; older than 0.7.0, so /tmp and /dev/shm have no size of their own";
  return c;
}

doctor_check check_userns() {
  doctor_check c{"user namespaces", true, "unprivileged user namespaces are enabled", ""};
  auto blockers = userns_blockers();
  if (blockers.empty()) return c;
  c.ok = false;
  c.detail.clear();
  for (const auto& b : blockers) c.detail += (c.detail.empty() ? "" : ", ") + b.found;
  c.fix = join_fixes(blockers);
  return c;
}

doctor_check check_sandbox_user(const sandbox_user& user) {
  doctor_check c{"sandbox uid", true, "", ""};
  passwd entry{}, *found = nullptr;
  char buffer[4096];
  ::getpwuid_r(user.uid, &entry, buffer, sizeof buffer, &found);
  std::string owner = found ? found->pw_name : "";
  c.detail = fmt::format("sandboxes run as uid {} gid {} (from {})", user.uid, user.gid, user.source);
  if (owner.empty()) {
    c.detail += "; no user has this uid";
  } else if (owner == "cairn-sandbox") {
    c.detail += ", the dedicated user cairn-sandbox";
  } else {
    c.ok = false;
    c.detail +=
        fmt::format(", which belongs to the user {}: that user's processes could interfere with runs", owner);
    c.fix =
        "useradd --system --no-create-home --shell /usr/sbin/nologin cairn-sandbox (then unset "
        "CAIRN_SANDBOX_UID)";
  }
  return c;
}

doctor_check check_sandbox_starts(const fs::path& bwrap, const std::optional<sandbox_user>& user) {
  doctor_check c{"sandbox starts", false, "", ""};
  std::vector<std::string> argv = {bwrap.string()};
  auto flags = bwrap_isolation_args(detect_bwrap_features(bwrap), resource_limits{}.max_tmp_bytes);
  argv.insert(argv.end(), flags.begin(), flags.end());
  // `true` as the sandbox's pid 1, which bwrap then reaps itself: a pid 1 of
  // bwrap's own would be left to the host's reaper (child_process.cpp), and
  // `cairn serve` runs this check at its start, maybe as a container's pid 1.
  argv.insert(argv.end(), {"--as-pid-1", "--", "/usr/bin/true"});
  std::optional<spawn_identity> run_as;
  if (user) run_as = spawn_identity{user->uid, user->gid};
  try {
    captured_run run = run_captured(argv, run_as, std::chrono::seconds(10));
    if (run.status && run.status->exited && run.status->code == 0) {
      c.ok = true;
      c.detail = "a sandbox ran /usr/bin/true";
      if (user) c.detail += fmt::format(" as uid {}", user->uid);
      return c;
    }
    c.detail = run.status ? fmt::format("bwrap {}", run.status->describe()) : "bwrap hung for 10 s";
    if (auto line = bwrap_line(run.output)) c.detail += ": " + *line;
    auto cause = diagnose_bwrap_failure(run.output);
    c.fix = cause ? *cause : "run the bwrap command by hand to see why it fails";
  } catch (const sandbox_error& e) {
    c.detail = e.what();
    c.fix = "check that bwrap is executable by the sandbox uid";
  }
  return c;
}

// Where what a crashed host leaves behind is recorded (own_records.hpp),
// and what was passed over: a folder another user made first is named.
doctor_check check_records() {
  records_place place = find_records_place();
  std::string passed;
  for (const auto& why : place.passed_over) passed += (passed.empty() ? "" : "; ") + why;
  if (!place.folder)
    return {"cairn's records", false, fmt::format("no folder of uid {} alone can hold them: {}", ::geteuid(), passed),
            "set XDG_RUNTIME_DIR to a folder of yours with mode 0700 (mkdir -m 0700 DIR), or have root remove "
            "the folders named"};
  std::string detail = fmt::format("kept in {}", place.folder->string());
  if (!passed.empty()) detail += fmt::format(", not in the usual place: {}", passed);
  return {"cairn's records", true, detail, ""};
}

doctor_check check_totals() {
  const cgroup_support& cgroups = detect_cgroups();
  doctor_check c{"resource totals", cgroups.mode != cgroup_mode::none, cgroups.detail, cgroups.fix};
  if (c.ok) c.detail += " (memory, processes and CPU time are bounded for each sandbox as a whole)";
  return c;
}

doctor_check check_quota() {
  quota_support quota = detect_workspace_quota();
  return {"workspace quota", quota.available, quota.detail, quota.fix};
}

}  // namespace

std::vector<doctor_check> bwrap_checks(const bwrap_options& options) {
  std::vector<doctor_check> checks;
  auto bwrap = find_bwrap(options.bwrap);
  checks.push_back(check_installed(bwrap));
  checks.push_back(check_userns());
  std::optional<sandbox_user> user;
  try {
    user = resolve_sandbox_user(options);
    if (user) checks.push_back(check_sandbox_user(*user));
  } catch (const sandbox_error& e) {
    checks.push_back(
        {"sandbox uid", false, e.what(), "set CAIRN_SANDBOX_UID to an unused nonzero uid, e.g. 61000"});
    return checks;
  }
  if (bwrap) checks.push_back(check_sandbox_starts(*bwrap, user));
  checks.push_back(check_records());
  checks.push_back(check_totals());
  checks.push_back(check_quota());
  return checks;
}

std::optional<std::string> diagnose_bwrap_failure(const std::string& log_tail) {
  auto line = bwrap_line(log_tail);
  if (!line) return std::nullopt;
  const std::string& l = *line;
  if (contains(l, "No permissions to creat") || contains(l, "uid map") || contains(l, "gid map") ||
      contains(l, "new namespace") || contains(l, "unshare")) {
    auto blockers = userns_blockers();
    std::string fix =
        blockers.empty()
            ? "check `cairn doctor` (on Ubuntu 23.10+ run `sysctl -w "
              "kernel.apparmor_restrict_unprivileged_userns=0` or give bwrap an AppArmor profile)"
            : join_fixes(blockers);
    return fmt::format(
        "user namespaces are denied by the kernel ({}): {}, or pass --sandbox none to run "
        "WITHOUT isolation",
        l, fix);
  }
  if (contains(l, "execvp /run/cairn/agent"))
    return fmt::format(
        "the agent program could not be started inside the sandbox ({}): only /usr and the "
        "/bin, /lib links are visible there, so a script's interpreter or a library it needs "
        "from elsewhere is missing",
        l);
  if (contains(l, "Can't find source path"))
    return fmt::format("a folder the sandbox mounts is missing or out of the sandbox uid's reach ({})", l);
  if (contains(l, "loopback") || contains(l, "RTM_NEWADDR"))
    return fmt::format(
        "the sandbox could not set up its private network ({}); cairn may itself run in a "
        "container that forbids it",
        l);
  if (contains(l, "Unknown option"))
    return fmt::format("this bubblewrap is too old ({}); cairn needs bubblewrap 0.8.0 or newer", l);
  return fmt::format("the sandbox failed to start: {}", l);
}

}  // namespace cairn::runtime
