#include "storage/payloads.hpp"

#include <openssl/evp.h>

#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>

namespace cairn::storage {
namespace {

constexpr std::string_view ref_prefix{"\0sha256:", 8};

std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 failed");
  std::string hex;
  hex.reserve(size * 2);
  for (unsigned int i = 0; i < size; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

json split(const json& value, split_value& out, std::unordered_set<std::string>& seen) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s.size() >= payload_min_bytes) {
      std::string digest = "sha256:" + sha256_hex(s);
      if (seen.insert(digest).second) out.pieces.push_back({digest, s});
      return std::string(1, '\0') + digest;
    }
    if (!s.empty() && s.front() == '\0') return std::string(1, '\0') + s;
    return value;
  }
  if (value.is_array()) {
    json a = json::array();
    for (const auto& v : value) a.push_back(split(v, out, seen));
    return a;
  }
  if (value.is_object()) {
    json o = json::object();
    for (const auto& [k, v] : value.items()) o[k] = split(v, out, seen);
    return o;
  }
  return value;
}

json join(const json& value, const std::function<std::string(const std::string&)>& body_of) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s.empty() || s.front() != '\0') return value;
    if (s.size() > 1 && s[1] == '\0') return s.substr(1);
    if (!std::string_view(s).starts_with(ref_prefix))
      throw std::runtime_error("a stored value holds a malformed payload reference");
    return body_of(s.substr(1));
  }
  if (value.is_array()) {
    json a = json::array();
    for (const auto& v : value) a.push_back(join(v, body_of));
    return a;
  }
  if (value.is_object()) {
    json o = json::object();
    for (const auto& [k, v] : value.items()) o[k] = join(v, body_of);
    return o;
  }
  return value;
}

}  // namespace

split_value split_payloads(const json& value) {
  split_value out;
  std::unordered_set<std::string> seen;
  out.manifest = split(value, out, seen);
  return out;
}

json join_payloads(const json& manifest, const std::function<std::string(const std::string& digest)>& body_of) {
  return join(manifest, body_of);
}

}  // namespace cairn::storage
