#include "engine/tools/address_range.hpp"

#include <boost/asio/ip/address.hpp>

namespace cairn::engine::http {
namespace {

namespace ip = boost::asio::ip;

std::optional<std::string> v4_range(const ip::address_v4& a) {
  const auto b = a.to_bytes();
  if (b == ip::address_v4::bytes_type{169, 254, 169, 254}) return "metadata";
  if (b[0] == 0) return "unspecified";
  if (b[0] == 127) return "loopback";
  if (b[0] == 169 && b[1] == 254) return "link-local";
  if (b[0] == 10 || (b[0] == 172 && (b[1] & 0xf0) == 16) || (b[0] == 192 && b[1] == 168)) return "private";
  if (b[0] == 100 && (b[1] & 0xc0) == 64) return "shared";
  if ((b[0] & 0xf0) == 224) return "multicast";
  if ((b[0] & 0xf0) == 240) return "reserved";  // 255.255.255.255 included
  return std::nullopt;
}

std::optional<std::string> v6_range(const ip::address_v6& a) {
  const auto b = a.to_bytes();
  if (a.is_v4_mapped()) return v4_range(ip::make_address_v4(ip::v4_mapped, a));
  static const ip::address_v6::bytes_type nat64 = {0, 0x64, 0xff, 0x9b};
  if (std::equal(b.begin(), b.begin() + 12, nat64.begin()))
    return v4_range(ip::address_v4({b[12], b[13], b[14], b[15]}));
  if (a == ip::make_address_v6("fd00:ec2::254")) return "metadata";
  if (a.is_unspecified()) return "unspecified";
  if (a.is_loopback()) return "loopback";
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return "link-local";
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return "private";  // site-local, deprecated but routable inside
  if ((b[0] & 0xfe) == 0xfc) return "private";                    // unique local (ULA)
  if (b[0] == 0xff) return "multicast";
  return std::nullopt;
}

std::optional<ip::address> parse(std::string_view text) {
  boost::system::error_code ec;
  auto a = ip::make_address(std::string(text), ec);
  if (ec) return std::nullopt;
  return a;
}

}  // namespace

std::optional<std::string> canonical_ip(std::string_view text) {
  auto a = parse(text);
  if (!a) return std::nullopt;
  return a->to_string();
}

std::optional<std::string> special_range(std::string_view text) {
  auto a = parse(text);
  if (!a) return "unspecified";  // not an address: nothing to connect to
  return a->is_v4() ? v4_range(a->to_v4()) : v6_range(a->to_v6());
}

}  // namespace cairn::engine::http
