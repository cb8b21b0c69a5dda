#include "storage/payloads.hpp"

#include <openssl/evp.h>
#include <zstd.h>

#include <memory>
#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>

#include "protocol/bounded_json.hpp"
#include "storage/journal.hpp"

namespace cairn::storage {
namespace {

constexpr std::string_view raw_prefix{"sha256:"};
constexpr std::string_view zstd_prefix{"zstd:"};
const std::string list_marker{"\0list", 5};
// zstd's default level: about 4x on prose at a few hundred MB/s, on the ledger's write path.
constexpr int zstd_level = 3;

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

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The body of `bytes` compressed, when that is shorter.
std::optional<std::string> compressed(const std::string& bytes) {
  thread_local std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  const std::size_t n = ZSTD_compressCCtx(cctx.get(), out.data(), out.size(), bytes.data(), bytes.size(), zstd_level);
  if (ZSTD_isError(n) || n >= bytes.size()) return std::nullopt;
  out.resize(n);
  return out;
}

class splitter {
 public:
  explicit splitter(split_value& out) : out_(out) {}

  json split(const json& value) {
    if (value.is_string()) {
      const auto& s = value.get_ref<const std::string&>();
      if (s.size() >= payload_min_bytes) return store(s);
      if (!s.empty() && s.front() == '\0') return std::string(1, '\0') + s;
      return value;
    }
    if (value.is_array()) return split_array(value);
    if (value.is_object()) {
      json o = json::object();
      for (const auto& [k, v] : value.items()) o[k] = split(v);
      return o;
    }
    return value;
  }

 private:
  // The reference to `bytes`, stored once.
  std::string store(const std::string& bytes) {
    const std::string hex = sha256_hex(bytes);
    auto body = compressed(bytes);
    std::string key = std::string(body ? zstd_prefix : raw_prefix) + hex;
    if (seen_.insert(key).second) out_.pieces.push_back({key, body ? std::move(*body) : bytes});
    return std::string(1, '\0') + key;
  }

  json split_array(const json& value) {
    std::vector<json> items;
    std::vector<std::size_t> sizes;
    std::size_t total = 0;
    for (const auto& v : value) {
      items.push_back(split(v));
      sizes.push_back(protocol::dumped_size(items.back()));
      total += sizes.back();
    }
    json head;  // null: no chunk closed
    std::size_t start = 0;
    if (total >= payload_min_bytes)
      for (std::size_t i = 0, bytes = 0; i < items.size(); ++i) {
        bytes += sizes[i];
        if (bytes < chunk_min_bytes) continue;
        json chunk = json::array({head});
        for (std::size_t j = start; j <= i; ++j) chunk.push_back(std::move(items[j]));
        head = store(dump(chunk));
        start = i + 1;
        bytes = 0;
      }
    json a = json::array();
    if (!head.is_null()) a = json::array({list_marker, head});
    for (std::size_t j = start; j < items.size(); ++j) a.push_back(std::move(items[j]));
    return a;
  }

  split_value& out_;
  std::unordered_set<std::string> seen_;
};

class joiner {
 public:
  joiner(const payload_lookup& body_of, const std::string& what) : body_of_(body_of), what_(what) {}

  json join(const json& value, std::size_t depth) {
    if (value.is_string()) {
      const auto& s = value.get_ref<const std::string&>();
      if (s.empty() || s.front() != '\0') return value;
      if (s.size() > 1 && s[1] == '\0') return s.substr(1);
      return body(s);
    }
    if (value.is_array()) {
      if (!value.empty() && value.front() == list_marker) return join_list(value, depth);
      json a = json::array();
      for (const auto& v : value) a.push_back(join(v, depth));
      return a;
    }
    if (value.is_object()) {
      json o = json::object();
      for (const auto& [k, v] : value.items()) o[k] = join(v, depth);
      return o;
    }
    return value;
  }

  std::uint64_t bytes_read() const { return read_; }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw storage_error(errc::corrupt, fmt::format("{} {}; restore the journal from a backup", what_, why));
  }

  void charge(std::uint64_t n) {
    read_ += n;
    if (read_ > decode_max_bytes)
      fail(fmt::format("takes more than {} bytes of payloads to read, more than cairn ever stores", decode_max_bytes));
  }

  // The string a reference "\0KEY" names.
  std::string body(const std::string& ref) {
    const std::string key = ref.substr(1);
    const bool packed = key.starts_with(zstd_prefix);
    if (!packed && !key.starts_with(raw_prefix)) fail("holds a malformed payload reference");
    auto stored = body_of_(key);
    if (!stored) fail(fmt::format("refers to payload {}, which the journal does not hold", key));
    if (!packed) {
      charge(stored->size());
      return std::move(*stored);
    }
    // Decompressed into the size its frame records, once that is within the bound.
    const auto size = ZSTD_getFrameContentSize(stored->data(), stored->size());
    if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR)
      fail(fmt::format("refers to payload {}, which is not a zstd frame with its size", key));
    charge(size);
    std::string out(size, '\0');
    const std::size_t n = ZSTD_decompress(out.data(), out.size(), stored->data(), stored->size());
    if (ZSTD_isError(n) || n != size) fail(fmt::format("refers to payload {}, which does not decompress", key));
    return out;
  }

  json join_list(const json& list, std::size_t depth) {
    if (depth >= protocol::max_depth) fail("nests its stored lists too deep");
    if (list.size() < 2 || !list[1].is_string()) fail("holds a malformed stored list");
    // The chunks from the last back to the first, then their items in order.
    std::vector<json> chunks;
    for (json ref = list[1]; !ref.is_null();) {
      if (!ref.is_string()) fail("holds a malformed stored list");
      const std::string text = body(ref.get<std::string>());
      json chunk;
      try {
        chunk = protocol::parse_bounded(text, what_);
      } catch (const protocol::json_error& e) {
        fail(fmt::format("holds a stored list whose chunk is not JSON ({})", e.what()));
      }
      if (!chunk.is_array() || chunk.size() < 2) fail("holds a malformed stored list");
      ref = std::move(chunk[0]);
      chunks.push_back(std::move(chunk));
    }
    json a = json::array();
    for (auto c = chunks.rbegin(); c != chunks.rend(); ++c)
      for (std::size_t i = 1; i < c->size(); ++i) a.push_back(join((*c)[i], depth + 1));
    for (std::size_t i = 2; i < list.size(); ++i) a.push_back(join(list[i], depth + 1));
    return a;
  }

  const payload_lookup& body_of_;
  const std::string& what_;
  std::uint64_t read_ = 0;
};

}  // namespace

split_value split_payloads(const json& value) {
  split_value out;
  splitter s(out);
  out.manifest = s.split(value);
  return out;
}

json join_payloads(const json& manifest, const payload_lookup& body_of, const std::string& what,
                   std::uint64_t* bytes) {
  joiner j(body_of, what);
  json value = j.join(manifest, 0);
  if (bytes) *bytes += j.bytes_read();
  return value;
}

stored_output encode_output(const json& output) {
  auto split = split_payloads(output);
  if (split.pieces.empty()) return {dump(output), {}};
  return {"~" + dump(split.manifest), std::move(split.pieces)};
}

bool is_output_manifest(const std::string& text) { return !text.empty() && text.front() == '~'; }

std::string_view output_json(const std::string& text) {
  return is_output_manifest(text) ? std::string_view(text).substr(1) : std::string_view(text);
}

}  // namespace cairn::storage
