#include "protocol/text.hpp"

namespace cairn::protocol {
namespace {

constexpr std::string_view ellipsis = "...";
constexpr std::string_view replacement = "\xEF\xBF\xBD";  // U+FFFD

bool continues_sequence(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

// The UTF-8 sequence at text[i], or U+FFFD for the one byte there that is
// not UTF-8; advances i past what it read.
std::string_view next_sequence(std::string_view text, std::size_t& i) {
  if (static_cast<unsigned char>(text[i]) < 0x80) return text.substr(i++, 1);
  const auto length = decode_utf8(text, i).second;
  if (length == 0) {
    ++i;
    return replacement;
  }
  i += length;
  return text.substr(i - length, length);
}

}  // namespace

std::pair<char32_t, std::size_t> decode_utf8(std::string_view text, std::size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return {c, 1};
  const std::size_t length = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (length == 0 || i + length > text.size()) return {0, 0};
  char32_t point = c & (0x7f >> length);
  for (std::size_t k = 1; k < length; ++k) {
    const auto next = static_cast<unsigned char>(text[i + k]);
    if (!continues_sequence(static_cast<char>(next))) return {0, 0};
    point = (point << 6) | (next & 0x3f);
  }
  static constexpr char32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (point < least[length] || point > 0x10ffff || (point >= 0xd800 && point <= 0xdfff)) return {0, 0};
  return {point, length};
}

bool is_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto length = decode_utf8(text, i).second;
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string clip(std::string_view text, std::size_t max_bytes) {
  const std::size_t room = max_bytes > ellipsis.size() ? max_bytes - ellipsis.size() : 0;
  std::string out;
  std::size_t cut = std::string::npos;  // where the "..." goes if the rest does not fit
  for (std::size_t i = 0; i < text.size();) {
    const auto piece = next_sequence(text, i);
    if (cut == std::string::npos && out.size() + piece.size() > room) cut = out.size();
    if (out.size() + piece.size() > max_bytes) {
      out.resize(cut);
      return out.append(ellipsis);
    }
    out.append(piece);
  }
  return out;
}

std::string clip_tail(std::string_view text, std::size_t max_bytes) {
  // Only the last max_bytes bytes can be kept; a sequence they cut into is dropped.
  std::size_t start = text.size() > max_bytes ? text.size() - max_bytes : 0;
  while (start > 0 && start < text.size() && continues_sequence(text[start])) ++start;
  std::string tail;
  for (std::size_t i = start; i < text.size();) tail.append(next_sequence(text, i));
  if (start == 0 && tail.size() <= max_bytes) return tail;
  const std::size_t room = max_bytes > ellipsis.size() ? max_bytes - ellipsis.size() : 0;
  std::size_t from = tail.size() > room ? tail.size() - room : 0;
  while (from < tail.size() && continues_sequence(tail[from])) ++from;
  return std::string(ellipsis).append(tail, from);
}

}  // namespace cairn::protocol
