// Test agent: looks for a host secret everywhere it can read from inside its
// sandbox. The secret comes reversed in the input (so the journal, which the
// sandbox cannot read anyway, never holds it in the clear) and is searched for
// in: its environment, its arguments, /proc (every process's environ,
// cmdline, status), and every readable file under / except /proc, /sys and
// the host's package-installed system files in /usr (a read-only bind of the
// host's own, 8 GB here; /usr/local is searched).
// First it calls llm.chat, which only succeeds if the host used the key.
//
// input: {"secrets_reversed": ["...", ...], "call_llm": true}
// output: {"found": [where...], "files_scanned": N, "proc_entries_scanned": N, "llm": reply or error}
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <cairn/cairn.hpp>

extern char** environ;

using cairn::json;
namespace fs = std::filesystem;

namespace {

bool holds_any(const std::string& data, const std::vector<std::string>& secrets) {
  for (const auto& s : secrets)
    if (data.find(s) != std::string::npos) return true;
  return false;
}

bool contains_secret(const fs::path& file, const std::vector<std::string>& secrets) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return false;
  std::string data;
  data.resize(4 << 20);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<std::size_t>(in.gcount()));
  return holds_any(data, secrets);
}

bool skipped(const fs::path& p) {
  static const char* system_dirs[] = {"/proc", "/sys", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
                                      "/usr/share", "/usr/include", "/usr/libexec", "/usr/src", "/usr/bin",
                                      "/usr/sbin", "/usr/games", "/lib", "/lib64", "/bin", "/sbin"};
  for (const char* d : system_dirs)
    if (p == d) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [argc, argv](cairn::context& ctx, const json& input) -> json {
    std::vector<std::string> secret;
    for (const auto& s : input.at("secrets_reversed")) {
      auto reversed = s.get<std::string>();
      secret.emplace_back(reversed.rbegin(), reversed.rend());
    }
    json llm;
    if (input.value("call_llm", true)) {
      try {
        llm = ctx.tool("llm.chat", {{"messages", {{{"role", "user"}, {"content", "Say hello"}}}}});
      } catch (const cairn::tool_error& e) {
        llm = {{"error", e.type()}, {"message", e.what()}};
      }
      if (holds_any(llm.dump(), secret)) return json{{"found", {"the llm.chat result"}}};
    }
    json result = ctx.step("hunt", [&] {
      json found = json::array();
      for (char** e = environ; *e; ++e)
        if (holds_any(*e, secret)) found.push_back("environment");
      for (int i = 0; i < argc; ++i)
        if (holds_any(argv[i], secret)) found.push_back("argv");

      int proc_entries = 0;
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator("/proc", ec)) {
        for (const char* f : {"environ", "cmdline", "status", "maps", "mountinfo"}) {
          auto p = entry.path() / f;
          if (!fs::exists(p, ec)) continue;
          ++proc_entries;
          if (contains_secret(p, secret)) found.push_back(p.string());
        }
      }
      int files = 0;
      for (auto it = fs::recursive_directory_iterator("/", fs::directory_options::skip_permission_denied, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) {
          ec.clear();
          continue;
        }
        if (it->is_directory(ec) && !it->is_symlink(ec) && skipped(it->path())) {
          it.disable_recursion_pending();
          continue;
        }
        if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
        ++files;
        if (contains_secret(it->path(), secret)) found.push_back(it->path().string());
      }
      return json{{"found", found}, {"files_scanned", files}, {"proc_entries_scanned", proc_entries}};
    });
    result["llm"] = llm;
    return result;
  });
}
