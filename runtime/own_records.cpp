#include "runtime/own_records.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t max_subject_bytes = 4096;

fs::path records_folder() {
  return ::geteuid() == 0 ? fs::path("/run/cairn-records") : fs::path(fmt::format("/tmp/cairn-records-{}", ::geteuid()));
}

// The folder, made if missing; empty when it is not ours alone.
unique_fd open_folder() {
  const fs::path folder = records_folder();
  if (::mkdir(folder.c_str(), 0700) < 0 && errno != EEXIST) return {};
  unique_fd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) < 0 || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) return {};
  return fd;
}

std::string random_token() {
  unsigned char bytes[16];
  for (std::size_t got = 0; got < sizeof bytes;) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  std::string token;
  for (unsigned char b : bytes) token += fmt::format("{:02x}", b);
  return token;
}

}  // namespace

own_record::own_record(const std::string& kind, const std::string& subject) : token_(random_token()) {
  unique_fd folder = open_folder();
  if (!folder)
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("{} cannot hold cairn's records: it must be a folder of uid {} that no one "
                                    "else may enter (mode 0700); remove it and try again",
                                    records_folder().string(), ::geteuid()));
  const std::string name = kind + "-" + token_;
  unique_fd fd(::openat(folder.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd || ::write(fd.get(), subject.data(), subject.size()) != static_cast<ssize_t>(subject.size())) {
    int error = errno;
    ::unlinkat(folder.get(), name.c_str(), 0);
    errno = error;
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("writing the record {}: {}", (records_folder() / name).string(), std::strerror(errno)));
  }
  file_ = records_folder() / name;
}

own_record::~own_record() {
  if (unique_fd folder = open_folder()) ::unlinkat(folder.get(), file_.filename().c_str(), 0);
}

std::vector<found_record> own_records(const std::string& kind) {
  std::vector<found_record> found;
  unique_fd folder = open_folder();
  int listing_fd = folder ? ::dup(folder.get()) : -1;
  DIR* listing = listing_fd < 0 ? nullptr : ::fdopendir(listing_fd);
  if (!listing) {
    if (listing_fd >= 0) ::close(listing_fd);
    return found;
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(listing, ::closedir);
  const std::string prefix = kind + "-";
  while (dirent* entry = ::readdir(listing)) {
    std::string name = entry->d_name;
    if (!name.starts_with(prefix)) continue;
    unique_fd fd(::openat(folder.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) continue;
    std::string subject(max_subject_bytes, '\0');
    ssize_t n = ::read(fd.get(), subject.data(), subject.size());
    subject.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    found.push_back({records_folder() / name, name.substr(prefix.size()), std::move(subject)});
  }
  return found;
}

void forget_record(const found_record& record) {
  if (unique_fd folder = open_folder()) ::unlinkat(folder.get(), record.file.filename().c_str(), 0);
}

}  // namespace cairn::runtime
