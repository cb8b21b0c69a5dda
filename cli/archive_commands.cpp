// `cairn export RUN` and `cairn import FILE`: a run as one archive
// (engine/run_archive.hpp), to move it between machines or journals.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/support.hpp"
#include "engine/run_archive.hpp"

namespace cairn::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A descriptor this command opened, closed when it goes out of scope.
struct opened_file {
  int fd = -1;
  opened_file() = default;
  explicit opened_file(int f) : fd(f) {}
  opened_file(const opened_file&) = delete;
  opened_file& operator=(const opened_file&) = delete;
  ~opened_file() {
    if (fd >= 0) ::close(fd);
  }
  explicit operator bool() const { return fd >= 0; }
};

}  // namespace

int export_command(const paths& p, const std::string& run_id, const std::string& output) {
  return guarded([&] {
    if (output.empty() && ::isatty(STDOUT_FILENO)) {
      std::cerr << "cairn: the archive is binary: redirect it (cairn export " << run_id << " > " << run_id
                << ".tar.zst) or give -o FILE\n";
      return 2;
    }
    const auto start = std::chrono::steady_clock::now();
    auto journal = storage::open_journal(p.db, {.read_only = true});
    // Written beside FILE and renamed onto it once whole: a failed export leaves no half archive.
    const std::string temp = output.empty() ? "" : fmt::format("{}.partial.{}", output, ::getpid());
    opened_file file(temp.empty() ? -1 : ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!temp.empty()) {
      if (!file) {
        std::cerr << fmt::format("cairn: cannot write {}: {}\n", temp, std::strerror(errno));
        return 3;
      }
    }
    engine::export_summary done;
    try {
      done = engine::write_run_archive(*journal, run_id, file ? file.fd : STDOUT_FILENO);
      if (file && ::fsync(file.fd) != 0) throw std::runtime_error(fmt::format("cannot sync {}: {}", temp, std::strerror(errno)));
    } catch (...) {
      if (!temp.empty()) ::unlink(temp.c_str());
      throw;
    }
    if (!temp.empty() && ::rename(temp.c_str(), output.c_str()) != 0) {
      std::cerr << fmt::format("cairn: cannot rename {} to {}: {}\n", temp, output, std::strerror(errno));
      ::unlink(temp.c_str());
      return 3;
    }
    std::cerr << fmt::format("exported run {}: {} steps, {} events, {} signals, {} workspace pieces ({} bytes "
                             "uncompressed) in {:.2f} s\n",
                             run_id, done.steps, done.events, done.signals, done.pieces, done.bytes, seconds_since(start));
    return 0;
  });
}

int import_command(const paths& p, const std::string& file, const std::string& id, bool as_json) {
  return guarded([&] {
    const auto start = std::chrono::steady_clock::now();
    opened_file opened(file == "-" ? -1 : ::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (file != "-") {
      if (!opened) {
        std::cerr << fmt::format("cairn: cannot read {}: {}\n", file, std::strerror(errno));
        return 2;
      }
    }
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    const auto imported = eng.import_run(opened ? opened.fd : STDIN_FILENO, id);
    if (as_json) {
      auto out = to_json(imported.run);
      out["imported_from"] = imported.from_run;
      out["workspace_restored"] = imported.workspace_restored;
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << imported.run.id << std::endl;
    const bool was_running = imported.exported_as == storage::run_status::running;
    std::cerr << fmt::format("imported run {}{} as {}{}: {} steps; {} in {:.2f} s\n", imported.from_run,
                             imported.run.id == imported.from_run ? "" : " as " + imported.run.id,
                             storage::to_string(imported.run.status),
                             was_running ? " (it was running when exported; nobody holds it here)" : "",
                             journal->step_count(imported.run.id),
                             imported.workspace_restored
                                 ? fmt::format("its workspace {} holds its last checkpoint's files", imported.run.workspace)
                                 : "it kept no workspace checkpoints",
                             seconds_since(start));
    return 0;
  });
}

}  // namespace cairn::cli
