// The special-purpose IP ranges that http.fetch does not reach unless its
// grant allows them: a name that resolves into one of them would let an agent
// talk to the host itself, its network, or a cloud metadata service.
// String-based so Boost.Asio stays in the .cpp files.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cairn::engine::http {

// The canonical text of an IP address ("127.0.0.1", "fd00:ec2::254"), or
// nullopt when `text` is not one. An IPv6 literal comes without brackets.
std::optional<std::string> canonical_ip(std::string_view text);

// Which special range `ip` (an IP address's text) falls in: "metadata"
// (169.254.169.254, fd00:ec2::254), "loopback", "link-local", "private"
// (RFC 1918, fc00::/7), "shared" (CGNAT 100.64.0.0/10), "unspecified"
// (0.0.0.0/8, ::), "multicast", "reserved" (240.0.0.0/4 and broadcast);
// nullopt for a public address. IPv4-mapped and NAT64 (64:ff9b::/96) IPv6
// addresses are judged by the IPv4 address they carry.
std::optional<std::string> special_range(std::string_view ip);

}  // namespace cairn::engine::http
