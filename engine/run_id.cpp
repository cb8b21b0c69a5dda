#include "engine/run_id.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cairn::engine {
namespace {

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

bool alnum(char c) { return id_char(c) && c != '.' && c != '_' && c != '-'; }

// The id as it may be shown: printable ASCII only, and cut short.
std::string shown(std::string_view id) {
  std::string out;
  for (char c : id.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return id.size() > 64 ? out + "..." : out;
}

}  // namespace

std::optional<std::string> run_id_problem(std::string_view id) {
  std::string why;
  if (id.empty()) why = "it is empty";
  else if (id.size() > max_run_id_size) why = fmt::format("it is {} characters long", id.size());
  else if (!alnum(id.front())) why = "it must start with a letter or a digit";
  else if (id.find("..") != std::string_view::npos) why = "it contains \"..\"";
  else
    for (char c : id)
      if (!id_char(c)) {
        why = "it contains a character other than letters, digits, '.', '_' and '-'";
        break;
      }
  if (why.empty())
    for (auto suffix : reserved_run_id_suffixes)
      if (id.size() >= suffix.size() && id.substr(id.size() - suffix.size()) == suffix) {
        why = fmt::format("it ends in \"{}\", a suffix cairn uses for its own files", suffix);
        break;
      }
  if (why.empty()) return std::nullopt;
  return fmt::format("'{}' is not a valid run id: {}; a run id is 1 to {} letters, digits, '.', '_' or '-', "
                     "starts with a letter or a digit, has no \"..\" and does not end in {}",
                     shown(id), why, max_run_id_size, fmt::join(reserved_run_id_suffixes, ", "));
}

}  // namespace cairn::engine
