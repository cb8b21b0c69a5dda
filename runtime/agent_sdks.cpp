#include "runtime/agent_sdks.hpp"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <random>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "runtime/host_paths.hpp"
#include "runtime/no_follow.hpp"

namespace cairn::runtime {

namespace fs = std::filesystem;

namespace {

fs::path existing(const fs::path& folder, const fs::path& marker) {
  std::error_code ec;
  return fs::exists(folder / marker, ec) ? folder : fs::path();
}

agent_sdks locate() {
  std::error_code ec;
  const fs::path installed = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path() / "share/cairn/sdk";
  agent_sdks found{existing(installed / "python", "cairn/__init__.py"), existing(installed / "js", "package.json")};
  if (found.python.empty()) found.python = existing(CAIRN_BUILT_PYTHON_SDK, "cairn/__init__.py");
  if (found.js.empty()) found.js = existing(CAIRN_SOURCE_JS_SDK, "package.json");
  return found;
}

// What a sandbox needs of an SDK: its files and the Python SDK's bytecode,
// without tests, benchmarks and development packages; links are not followed.
std::vector<fs::path> sdk_files(const fs::path& sdk) {
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(sdk); it != fs::recursive_directory_iterator(); ++it) {
    const auto name = it->path().filename().string();
    if (name == "node_modules" || name == "test" || name == "tests" || name == "bench") {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && !it->is_symlink()) files.push_back(fs::relative(it->path(), sdk));
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string content_digest(const fs::path& sdk, const std::vector<fs::path>& files) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr);
  for (const auto& file : files) {
    const std::string name = file.string();
    EVP_DigestUpdate(md.get(), name.c_str(), name.size() + 1);
    std::ifstream in(sdk / file, std::ios::binary);
    char buffer[65536];
    while (in.read(buffer, sizeof buffer) || in.gcount() > 0) EVP_DigestUpdate(md.get(), buffer, in.gcount());
    EVP_DigestUpdate(md.get(), "", 1);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(md.get(), digest, &size);
  std::string hex;
  for (unsigned int i = 0; i < 12 && i < size; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

// The copy of `sdk` under `cache` (a root-only folder), made if missing:
// under a temporary name, then renamed into place, so no process ever
// sees it half made.
fs::path copy_of(const fs::path& sdk, const fs::path& cache, const std::string& kind) {
  const auto files = sdk_files(sdk);
  const fs::path copy = cache / (kind + "-" + content_digest(sdk, files));
  std::error_code ec;
  if (fs::is_directory(copy, ec)) return copy;
  const fs::path staging = cache / fmt::format(".{}-{}-{}", kind, ::getpid(), std::random_device{}());
  fs::create_directory(staging);
  ::chmod(staging.c_str(), 0755);
  for (const auto& file : files) {
    fs::create_directories((staging / file).parent_path());
    for (fs::path dir = (staging / file).parent_path(); dir != staging; dir = dir.parent_path()) ::chmod(dir.c_str(), 0755);
    fs::copy_file(sdk / file, staging / file);
    ::chmod((staging / file).c_str(), 0644);
  }
  fs::rename(staging, copy, ec);
  if (ec) fs::remove_all(staging);  // another cairn made it first
  return copy;
}

}  // namespace

agent_sdks readable_agent_sdks(const agent_sdks& found, uid_t uid, gid_t gid) {
  const fs::path cache = "/var/cache/cairn/sdk";
  agent_sdks readable = found;
  for (auto [sdk, kind] : {std::pair{&readable.python, "python"}, std::pair{&readable.js, "js"}}) {
    if (sdk->empty() || !first_unsearchable_dir(*sdk / "x", uid, gid)) continue;
    unique_fd folder = open_folder_no_follow(cache, 0755);
    struct stat st {};
    if (::fstat(folder.get(), &st) < 0 || st.st_uid != 0 || (st.st_mode & 022))
      throw sandbox_error(sandbox_errc::bad_spec,
                          fmt::format("{} holds the copies of cairn's SDKs that sandboxes read, but it is not root's "
                                      "alone; remove it (rm -r {}) and cairn makes it again",
                                      cache.string(), cache.string()));
    *sdk = copy_of(*sdk, cache, kind);
  }
  return readable;
}

const agent_sdks& find_agent_sdks() {
  static const agent_sdks sdks = locate();
  return sdks;
}

}  // namespace cairn::runtime
