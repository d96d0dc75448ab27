#pragma once
// Where this process's TCP sockets listen, read back from the kernel for test_distributed's `exposure` scenario
// (tests/reliability/distributed.cmake): /proc/self/fd maps the descriptors to socket inodes, /proc/net/tcp and
// /proc/net/tcp6 give each listening socket's local address by inode, getsockopt(SO_BINDTODEVICE) its interface.
// Deliberately independent of branchgrpo/torch/distributed.hpp's own socket code, which it checks.
//
//   own_listeners()              this process's listening sockets: {fd, "127.0.0.1", 41234, "" or "lo"}
//   host_addresses()             this host's addresses other than loopback and link-local: {"192.0.2.2", ...}
//   connects(address, port)      whether a TCP connection to address:port is accepted (within 2 s)
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace exposure {

/// One listening socket of this process.
struct listener {
  int fd = -1;
  std::string address;  // "127.0.0.1", "::", "::ffff:127.0.0.1"
  int port = 0;
  bool loopback = false;  // the address is 127.0.0.0/8, ::1 or an IPv4-mapped 127.x
  std::string device;     // SO_BINDTODEVICE: "" when bound to no interface
};

// A /proc/net/tcp{,6} address: the kernel prints each 32-bit word of the network-order address as a host-order
// hex number ("0100007F" is 127.0.0.1 on a little-endian host), then the port in hex ("0100007F:1F90").
inline listener decode(const std::string& field) {
  listener decoded;
  const std::size_t colon = field.find(':');
  const std::string hex = field.substr(0, colon);
  decoded.port = std::stoi(field.substr(colon + 1), nullptr, 16);
  unsigned char bytes[16] = {};
  for (std::size_t word = 0; word * 8 < hex.size(); ++word) {
    const auto value = static_cast<std::uint32_t>(std::stoul(hex.substr(word * 8, 8), nullptr, 16));
    std::memcpy(bytes + word * 4, &value, 4);
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (hex.size() == 8) {
    ::inet_ntop(AF_INET, bytes, text, sizeof text);
    decoded.loopback = bytes[0] == 127;
  } else {
    in6_addr address{};
    std::memcpy(&address, bytes, 16);
    ::inet_ntop(AF_INET6, &address, text, sizeof text);
    decoded.loopback = IN6_IS_ADDR_LOOPBACK(&address) || (IN6_IS_ADDR_V4MAPPED(&address) && bytes[12] == 127);
  }
  decoded.address = text;
  return decoded;
}

/// This process's listening TCP sockets (IPv4 and IPv6) with their addresses and interfaces.
/// Example: after a 2-rank join on 127.0.0.1, rank 0 has the store's {fd, "127.0.0.1", MASTER_PORT, ""} (LibTorch
///   2.1+) or {fd, "::", MASTER_PORT, "lo"} (1.13), and Gloo's {fd, "127.0.0.1", <ephemeral>, ""}.
inline std::vector<listener> own_listeners() {
  std::map<std::string, int> fd_of_inode;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.starts_with("socket:["))
      fd_of_inode[target.substr(8, target.size() - 9)] = std::stoi(entry.path().filename().string());
  }
  std::vector<listener> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      const auto fd = fd_of_inode.find(inode);
      if (state != "0A" || fd == fd_of_inode.end()) continue;  // 0A: LISTEN
      listener l = decode(local);
      l.fd = fd->second;
      char device[IFNAMSIZ + 1] = {};
      socklen_t size = IFNAMSIZ;
      if (::getsockopt(l.fd, SOL_SOCKET, SO_BINDTODEVICE, device, &size) == 0) l.device = device;
      found.push_back(l);
    }
  }
  return found;
}

/// The name of the loopback interface ("lo").
inline std::string loopback_interface() {
  ifaddrs* interfaces = nullptr;
  std::string name = "lo";
  if (::getifaddrs(&interfaces) != 0) return name;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next)
    if ((i->ifa_flags & IFF_LOOPBACK) != 0) name = i->ifa_name;
  ::freeifaddrs(interfaces);
  return name;
}

/// This host's IPv4 and IPv6 addresses other than loopback and link-local ones (those need a scope to dial):
/// where another host would reach a socket listening on every interface.
/// Example: {"192.0.2.2", "fd00::2"} on a host with one Ethernet interface.
inline std::vector<std::string> host_addresses() {
  std::vector<std::string> found;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return found;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_LOOPBACK) != 0 || (i->ifa_flags & IFF_UP) == 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const in6_addr& address = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&address)) continue;
      ::inet_ntop(AF_INET6, &address, text, sizeof text);
    } else {
      continue;
    }
    found.emplace_back(text);
  }
  ::freeifaddrs(interfaces);
  return found;
}

/// Whether a TCP connection to `address`:`port` is accepted within 2 s (a local one is accepted or refused at
/// once). The connection is closed again.
/// Example: connects("127.0.0.1", store_port) on rank 0 after the join; !connects("192.0.2.2", store_port).
inline bool connects(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool accepted = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  if (fd >= 0 && !accepted && errno == EINPROGRESS) {
    pollfd wait{.fd = fd, .events = POLLOUT, .revents = 0};
    int error = 0;
    socklen_t size = sizeof error;
    accepted = ::poll(&wait, 1, 2000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return accepted;
}

}  // namespace exposure
