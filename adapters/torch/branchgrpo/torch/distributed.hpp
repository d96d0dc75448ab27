#pragma once
// Multi-process training over torch.distributed's C++ core (c10d): the Communicator of distributed/communicator.hpp
// on c10d's process groups, with no communication layer of our own.
//
//   read_launch_environment(lookup)        torchrun's environment contract (RANK, WORLD_SIZE, LOCAL_RANK,
//                                          LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), checked; nullopt when
//                                          WORLD_SIZE is unset (one process)
//   communicator_from_environment(options) the same from the process environment, joined into a group
//   c10d_communicator                      Communicator: rendezvous on a c10d::TCPStore (rank 0 hosts it at
//                                          MASTER_ADDR:MASTER_PORT), Gloo for host data, NCCL for CUDA tensors
//                                          where LibTorch has it; all_reduce_sum of tensors (gradients)
//   distributed_error                      a rank died or hangs, or a collective failed: one line naming the rank
//   parameters_digest, check_same_parameters   XXH64 of tensors, compared across the ranks (a debug check)
//
// Faults. A collective over Gloo fails with "Connection closed by peer" when a peer died and with "Timed out" when
// one hangs, without saying which rank. So before each collective a rank records in the store the collective's
// sequence number ("entered/<rank>" = 7), and a rank whose collective fails records "failed/<rank>" and waits a
// short grace for the others' reports: a rank without a report is the culprit, named by the last collective it
// entered: "rank 1 did not reach collective 7 (all_reduce, timeout 5 s): it died or hangs". The collective timeout
// is the option's timeout less the grace, so a survivor throws within timeout_seconds. The cost is one store write
// (a loopback or LAN round trip to rank 0) per collective; the trainer runs a few per iteration.
//
// Exposure. Rank 0's store listens where MASTER_ADDR says (detail::store_bind_address): on exactly that address
// when it is numeric ("127.0.0.1", "10.0.0.1", "::1") or localhost, on every interface for any other host name
// (a name can resolve on rank 0 to another address than the other hosts reach it at: Debian's /etc/hosts maps the
// host's own name to 127.0.1.1). LibTorch 2.1+ takes over a socket we bind (TCPStoreOptions::masterListenFd);
// LibTorch 1.13 binds every interface itself, so there a loopback MASTER_ADDR binds its socket to the loopback
// interface instead (SO_BINDTODEVICE: no other host can connect), and a non-loopback one stays on every
// interface. The store has no authentication: docs/distributed.md, "Exposure".
//
// Background threads and destructors. LibTorch's c10d objects run threads of their own (TCPStore's watch-key
// daemon, Gloo's event loop, ProcessGroupGloo's workers). LibTorch 1.13's TCPStore daemon throws std::system_error
// "Connection reset by peer" out of its thread when the store's host dies while a connection to it is not yet
// accepted or holds unread bytes (a SIGKILL of rank 0 during the start, about 1 in 6), which was std::terminate:
// exit 134 on the survivor; Gloo writes with writev(2), which raises SIGPIPE on a reset connection. While a
// c10d_communicator is alive (detail::lost_peer_guard), an exception that reaches std::terminate ends the process
// with one line and exit status 1 instead: the group's first fault when a join or a collective already failed, else
// "rank 1 lost its connection to rank 0 (the store at 127.0.0.1:29500): it died or the network failed (Connection
// reset by peer)"; and SIGPIPE is ignored, so such a write fails as the collective's error.
//
// Joining, in one line. Before TCPStore connects, a rank waits for MASTER_ADDR to resolve and (but rank 0) for the
// store to accept a connection (detail::wait_for_store), so a rank that cannot join ends within the timeout with
// one line saying why ("... MASTER_ADDR = 'x' ...: the name does not resolve (...)"). TCPStore's own retries would
// log a line each ("[W socket.cpp:601] [c10d] The IPv6 network addresses of (x, 29500) cannot be retrieved", one
// a second, so their number grows with the timeout) and, on LibTorch 2.x, start over after the timeout.
// detail::quiet_torch_log hides LibTorch's c10d lines while a rank joins and while a fault is diagnosed
// (docs/distributed.md, "Distributed output").
//
// Which process groups exist is decided by CMake alone (adapters/CMakeLists.txt): BRANCHGRPO_C10D_GLOO when Gloo's
// headers are found (Debian: libgloo-dev), BRANCHGRPO_C10D_NCCL on a CUDA LibTorch with NCCL. Not c10d's own
// USE_C10D_GLOO / USE_C10D_NCCL: LibTorch 2.x's CMake target defines those for every consumer, also where its wheel
// ships no Gloo headers. Without Gloo this header is unusable.
#if !defined(BRANCHGRPO_C10D_GLOO)
#error "branchgrpo/torch/distributed.hpp needs Gloo's headers (Debian: libgloo-dev): install them and reconfigure"
#endif

#include "branchgrpo/torch/compat.hpp"  // first: LibTorch's CHECK macro guard

#pragma push_macro("CHECK")
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(BRANCHGRPO_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#pragma pop_macro("CHECK")

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/hash.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/distributed/consistency.hpp"

namespace branchgrpo {

/// A multi-process run cannot go on: a rank died or hangs, the store is unreachable, or a collective failed.
/// what() is one line that names the rank when one is to blame.
class distributed_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How a process joins its group.
/// Example: distributed_options{.timeout_seconds = 5} (the tests); the defaults for a training run.
struct distributed_options {
  /// Longest wait for the rendezvous and for any collective, fault report included: a rank that died or hangs
  /// ends the others within it. In [1, 86400].
  double timeout_seconds = 300;
  /// Network interface Gloo uses (e.g. "eth0"). Empty: GLOO_SOCKET_IFNAME when set (torch's variable), else the
  /// loopback address when MASTER_ADDR is a loopback one (every rank on this host), else the address of this
  /// host's name.
  std::string gloo_interface = {};
  /// CUDA tensors through NCCL when LibTorch has it (BRANCHGRPO_C10D_NCCL); else through Gloo via host copies.
  bool nccl = true;
};

/// torchrun's environment contract, checked.
struct launch_environment {
  int rank = 0;                  // RANK, in [0, world_size)
  int world_size = 1;            // WORLD_SIZE
  int local_rank = 0;            // LOCAL_RANK (default RANK): this rank's CUDA device on its node
  int local_world_size = 1;      // LOCAL_WORLD_SIZE (default WORLD_SIZE)
  std::string master_addr = {};  // MASTER_ADDR: where rank 0 hosts the store
  int master_port = 0;           // MASTER_PORT
  bool agent_store = false;      // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store, no rank does
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT: keys of a restarted attempt never meet the last one's
};

/// The launch environment read through `lookup(name)` (a const char*, nullptr when unset); nullopt when
/// WORLD_SIZE is unset. Throws invalid_input naming the variable when one is malformed or a required one missing.
/// Example: {WORLD_SIZE=2, RANK=1, MASTER_ADDR=127.0.0.1, MASTER_PORT=29500} -> rank 1 of 2, local rank 1 of 2;
///   RANK=x -> "RANK = x: must be an integer in [0, 1]";
///   no MASTER_PORT -> "MASTER_PORT is not set (WORLD_SIZE is: a multi-process launch needs RANK, MASTER_ADDR and
///   MASTER_PORT too)".
/// @post 0 <= rank < world_size, 0 <= local_rank < local_world_size <= world_size, master_port in [1, 65535].
template <class Lookup>
std::optional<launch_environment> read_launch_environment(Lookup&& lookup) {
  const auto text = [&](const char* name) -> std::optional<std::string_view> {
    const char* value = lookup(name);
    if (value == nullptr) return std::nullopt;
    return std::string_view(value);
  };
  const auto required = [&](const char* name) {
    const std::optional<std::string_view> value = text(name);
    require(value.has_value(), name,
            " is not set (WORLD_SIZE is: a multi-process launch needs RANK, MASTER_ADDR and MASTER_PORT too)");
    return *value;
  };
  const std::optional<std::string_view> world = text("WORLD_SIZE");
  if (!world) return std::nullopt;
  launch_environment e;
  e.world_size = parse_integer<int>(*world, "WORLD_SIZE", 1, 1 << 20);
  e.rank = parse_integer<int>(required("RANK"), "RANK", 0, e.world_size - 1);
  const std::optional<std::string_view> local_world = text("LOCAL_WORLD_SIZE");
  e.local_world_size =
      local_world ? parse_integer<int>(*local_world, "LOCAL_WORLD_SIZE", 1, e.world_size) : e.world_size;
  const std::optional<std::string_view> local_rank = text("LOCAL_RANK");
  e.local_rank =
      parse_integer<int>(local_rank ? *local_rank : std::to_string(e.rank), "LOCAL_RANK", 0, e.local_world_size - 1);
  e.master_addr = std::string(required("MASTER_ADDR"));
  require(!e.master_addr.empty() && e.master_addr.find_first_of(" \t\n") == std::string::npos, "MASTER_ADDR = '",
          echo_text(e.master_addr), "': must be a host name or address");
  e.master_port = parse_integer<int>(required("MASTER_PORT"), "MASTER_PORT", 1, 65535);
  const std::optional<std::string_view> agent = text("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
  if (const std::optional<std::string_view> restarts = text("TORCHELASTIC_RESTART_COUNT"))
    e.restart_count = parse_integer<int>(*restarts, "TORCHELASTIC_RESTART_COUNT", 0, 1 << 30);
  return e;
}

/// The process environment's launch_environment (read_launch_environment over std::getenv).
inline std::optional<launch_environment> launch_environment_from_process() {
  return read_launch_environment([](const char* name) { return std::getenv(name); });
}

namespace detail {

/// While alive, LibTorch's c10d log lines are not printed: TCPStore's line per connection retry ("[W
/// socket.cpp:601] [c10d] The IPv6 network addresses of (x, 29500) cannot be retrieved (gai error: -2 - Name or
/// service not known).", one a second for the whole timeout), its final "[E socket.cpp:860] ... timed out", its
/// lines when it cannot listen ("[W socket.cpp:426] The server socket has failed to bind to [::]:29500 (errno: 98
/// - Address already in use).") and glog's "WARNING: Logging before InitGoogleLogging()". The error the
/// communicator throws says what failed, in one line. Setting TORCH_CPP_LOG_LEVEL (LibTorch's own variable, e.g.
/// TORCH_CPP_LOG_LEVEL=INFO to debug a rendezvous) leaves the logging as it is. Example: { quiet_torch_log quiet; store
/// = TCPStore(...); }  // nothing on stderr while it retries
///
/// Why this flag: every c10d line passes `c10d::detail::isLogLevelEnabled`, which compares it with
/// FLAGS_caffe2_log_level, in LibTorch 1.13 and 2.x alike and whichever logger prints it (glog in Debian's 1.13,
/// c10's own in pip's 2.x). A c10::WarningHandler sees only TORCH_WARN, which c10d's lines are not; glog's
/// FLAGS_minloglevel exists only in glog builds; redirecting fd 2 would also swallow what other threads print and
/// anything printed by a crash meanwhile. The flag is a plain int that LibTorch's own threads read (rank 0's store
/// daemon): while the guard is alive their c10d lines are hidden too, which is what it is for; c10 writes the
/// flag the same way (c10::ShowLogInfoToStderr). Nests: each guard restores the level it found.
class quiet_torch_log {
 public:
  quiet_torch_log() : active_(std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr), previous_(FLAGS_caffe2_log_level) {
    if (active_) FLAGS_caffe2_log_level = std::max(previous_, fatal);
  }
  ~quiet_torch_log() {
    if (active_) FLAGS_caffe2_log_level = previous_;
  }
  quiet_torch_log(const quiet_torch_log&) = delete;
  quiet_torch_log& operator=(const quiet_torch_log&) = delete;

 private:
  using level = std::remove_cvref_t<decltype(FLAGS_caffe2_log_level)>;
  static constexpr level fatal = 3;  // c10's levels: INFO 0, WARNING 1, ERROR 2, FATAL 3
  bool active_;
  level previous_;
};

/// What a rank holds while its c10d objects live, so that a peer lost at any moment ends it with one line and exit
/// status 1, never with a signal (c10d_communicator holds one for its whole life, declared before its c10d members
/// so that it outlives their destructors, which join their threads):
///   - an exception that reaches std::terminate (one escaping a thread of LibTorch's, a destructor or a noexcept
///     function, on any thread) ends the process with "<program>: <line>" on stderr and std::_Exit(1) after
///     flushing stdout (no static destructor runs while c10d's threads talk to a dead peer), instead of
///     std::abort's 134. The line is the group's first fault (record_fault: the error a failed join or collective
///     threw, which the run is already ending with), else, for a std::system_error (c10d's socket errors), the
///     `lost` line of describe() and the error, else its `failed` line and the error:
///     "branchgrpo: rank 1 lost its connection to rank 0 (the store at 127.0.0.1:29500): it died or the network
///     failed (Connection reset by peer)". std::terminate without an exception goes to the handler installed before.
///     When several threads terminate at once, the first one's line is the only one;
///   - SIGPIPE is ignored: Gloo writes with writev(2), which raises SIGPIPE on a connection its peer reset (the
///     default action ends the process without a word, status 141); ignored, the write fails with EPIPE, which Gloo
///     reports as the collective's error (Python, LibTorch's usual host, ignores SIGPIPE from its start).
/// Nests (a count); the last one restores the previous terminate handler (when ours is still installed) and
/// SIGPIPE's previous action. Copies are guards too.
class lost_peer_guard {
 public:
  lost_peer_guard() { enter(); }
  lost_peer_guard(const lost_peer_guard&) { enter(); }
  lost_peer_guard& operator=(const lost_peer_guard&) = default;
  ~lost_peer_guard() {
    state& s = shared();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.guards > 0) return;
    if (std::get_terminate() == &end_process) std::set_terminate(s.previous);
    ::sigaction(SIGPIPE, &s.previous_sigpipe, nullptr);
    s.lost.clear();
    s.failed.clear();
    s.fault.clear();
  }

  /// The lines for an escaped std::system_error (`lost`) and any other exception (`failed`); the error's first line
  /// is appended in parentheses.
  void describe(std::string lost, std::string failed) {
    state& s = shared();
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.lost = std::move(lost);
    s.failed = std::move(failed);
  }
  /// `line` becomes the line the process ends with, unless a fault was recorded before (the first one is the cause).
  void record_fault(const std::string& line) {
    state& s = shared();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.fault.empty()) s.fault = line;
  }

 private:
  struct state {
    std::mutex mutex;
    int guards = 0;
    std::terminate_handler previous = nullptr;
    struct ::sigaction previous_sigpipe {};
    std::string lost, failed, fault;
  };
  // Never destroyed: a thread may terminate during static destruction.
  static state& shared() {
    static state* const s = new state;  // NOLINT(cppcoreguidelines-owning-memory): leaked on purpose
    return *s;
  }
  static void enter() {
    state& s = shared();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.guards++ > 0) return;
    s.previous = std::set_terminate(&end_process);
    struct ::sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &s.previous_sigpipe);
  }
  static void write_line(const std::string& line) {
    std::size_t done = 0;
    while (done < line.size()) {
      const ::ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  }
  // The line for `escaped` ("" when no guard is alive).
  static std::string line_for(const std::exception_ptr& escaped) {
    std::string what = "an exception of unknown type";
    bool socket = false;
    try {
      std::rethrow_exception(escaped);
    } catch (const std::system_error& error) {
      what = error.what();
      socket = true;
    } catch (const std::exception& error) {
      what = error.what();
    } catch (...) {  // NOLINT(bugprone-empty-catch): "an exception of unknown type"
    }
    what = what.substr(0, what.find('\n'));
    state& s = shared();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.guards == 0) return "";
    if (!s.fault.empty()) return s.fault;
    return (socket ? s.lost : s.failed) + " (" + what + ")";
  }
  [[noreturn]] static void end_process() noexcept {
    static std::atomic<bool> ending{false};
    if (ending.exchange(true))  // another thread is ending the process with its line
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    const std::exception_ptr escaped = std::current_exception();
    std::string line;
    std::terminate_handler previous = nullptr;
    try {
      if (escaped) line = line_for(escaped);
      const std::lock_guard<std::mutex> lock(shared().mutex);
      previous = shared().previous;
    } catch (...) {
      line = "an exception escaped a thread of the process group";
    }
    if (line.empty()) {
      if (previous != nullptr) previous();
      std::abort();
    }
    std::fflush(stdout);
    write_line(std::string(program_invocation_short_name) + ": " + echo_middle(line, 1000) + "\n");
    std::_Exit(1);
  }
};

/// A file descriptor, closed with its owner.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  [[nodiscard]] int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// An IPv4 or IPv6 socket address.
struct socket_address {
  sockaddr_storage storage{};
  socklen_t length = 0;

  [[nodiscard]] int family() const { return storage.ss_family; }
  /// 127.0.0.0/8, ::1 or an IPv4-mapped 127.x (::ffff:127.0.0.1).
  [[nodiscard]] bool loopback() const {
    if (family() == AF_INET) {
      const auto& ip = reinterpret_cast<const sockaddr_in&>(storage);  // NOLINT: the sockets API's idiom
      return (ntohl(ip.sin_addr.s_addr) >> 24) == 127;
    }
    const auto& ip = reinterpret_cast<const sockaddr_in6&>(storage);  // NOLINT
    return IN6_IS_ADDR_LOOPBACK(&ip.sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&ip.sin6_addr) && ip.sin6_addr.s6_addr[12] == 127);
  }
};

/// Why the store at `host`:`port` could not be reached by `deadline`: whether the name resolved, and the last
/// failure (gai_strerror, strerror).
struct store_unreachable {
  bool resolved = false;
  std::string reason;
};

// One TCP connection attempt to `address`, given up after `wait_ms`: "" when accepted (then closed again), else
// why not ("Connection refused", "timed out").
inline std::string try_connect(const addrinfo& address, int wait_ms) {
  const unique_fd probe(::socket(address.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (probe.get() < 0) return std::strerror(errno);
  if (::connect(probe.get(), address.ai_addr, address.ai_addrlen) == 0) return "";
  if (errno != EINPROGRESS) return std::strerror(errno);
  pollfd wait{.fd = probe.get(), .events = POLLOUT, .revents = 0};
  if (::poll(&wait, 1, wait_ms) != 1) return "timed out";
  int error = 0;
  socklen_t size = sizeof error;
  if (::getsockopt(probe.get(), SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
  return error == 0 ? "" : std::strerror(error);
}

/// Waits until `host` resolves and, when `connect`, until a TCP connection to one of its addresses on `port` is
/// accepted (and closed again: TCPStore opens its own); nullopt then, else why not once `deadline` passed. Tries
/// every 250 ms, since rank 0 may start last and a cluster's DNS may learn rank 0's name late.
/// Why not TCPStore's own retries alone: they log a line each, and LibTorch 2.x's constructor starts over once its
/// timeout passed (measured on 2.8: 5.3 s for a timeout of 3 s), so a rank would overrun the timeout it was given;
/// once this returns, TCPStore connects at the first try.
/// Example: nothing listening on 127.0.0.1:29513 -> {.resolved = true, .reason = "Connection refused"} at the
///   deadline; "no-such-host.invalid" -> {.resolved = false, .reason = "Name or service not known"}.
inline std::optional<store_unreachable> wait_for_store(const std::string& host, int port, bool connect,
                                                       std::chrono::steady_clock::time_point deadline) {
  using clock = std::chrono::steady_clock;
  const std::string service = std::to_string(port);
  store_unreachable last;
  while (true) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int status = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); status != 0) {
      last = {.resolved = false, .reason = ::gai_strerror(status)};
    } else {
      last = {.resolved = true, .reason = ""};
      for (const addrinfo* address = found; connect && address != nullptr; address = address->ai_next) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
        last.reason = try_connect(*address, static_cast<int>(std::clamp<std::int64_t>(left, 1, 1000)));
        if (last.reason.empty()) break;
      }
      ::freeaddrinfo(found);
      if (last.reason.empty()) return std::nullopt;
    }
    const auto now = clock::now();
    if (now >= deadline) return last;
    std::this_thread::sleep_for(std::min<clock::duration>(std::chrono::milliseconds(250), deadline - now));
  }
}

/// The address rank 0's store listens on for MASTER_ADDR `host`: the address itself when numeric, localhost's
/// first address (as /etc/hosts lists it) for "localhost", nullopt (every interface) for any other host name,
/// because a name can resolve on rank 0 to another address than the one the other hosts reach it at (Debian's
/// /etc/hosts maps the host's own name to 127.0.1.1: binding that would lock every other host out).
/// Example: "127.0.0.1" -> 127.0.0.1 (loopback); "10.0.0.1" -> 10.0.0.1; "::1" -> ::1; "localhost" -> ::1 or
///   127.0.0.1; "node01" -> nullopt.
inline std::optional<socket_address> store_bind_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host == "localhost" ? 0 : AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return std::nullopt;
  socket_address address;
  address.length = found->ai_addrlen;
  std::memcpy(&address.storage, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  return address;
}

/// MASTER_ADDR that names this host's loopback interface: a numeric loopback address or "localhost" (every rank is
/// then on this host).
/// Example: is_loopback_master("127.0.0.1") and is_loopback_master("localhost"); not "10.0.0.1", not "node01".
inline bool is_loopback_master(const std::string& host) {
  const std::optional<socket_address> address = store_bind_address(host);
  return address && address->loopback();
}

/// A TCP socket listening on `address`:`port` (SO_REUSEADDR, like TCPStore's own, so that a run restarted at once
/// finds the port free of the last one's TIME_WAIT connections; close-on-exec). Throws distributed_error
/// "rank 0 cannot host the store at 10.0.0.9:29500: bind: Cannot assign requested address (MASTER_ADDR is not an
/// address of this host)".
inline unique_fd listen_on(socket_address address, int port, const std::string& where) {
  const auto step_failed = [&](const char* step) {
    const int error = errno;
    std::string text = "rank 0 cannot host the store at " + where + ": " + step + ": " + std::strerror(error);
    if (error == EADDRNOTAVAIL) text += " (MASTER_ADDR is not an address of this host)";
    return distributed_error(text);
  };
  if (address.family() == AF_INET)
    reinterpret_cast<sockaddr_in&>(address.storage).sin_port = htons(static_cast<std::uint16_t>(port));  // NOLINT
  else
    reinterpret_cast<sockaddr_in6&>(address.storage).sin6_port = htons(static_cast<std::uint16_t>(port));  // NOLINT
  unique_fd listener(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) throw step_failed("socket");
  // Unchecked: without it only a restart within TIME_WAIT fails, and then the bind says so.
  const int on = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0)  // NOLINT
    throw step_failed("bind");
  if (::listen(listener.get(), SOMAXCONN) != 0) throw step_failed("listen");
  return listener;
}

/// Hands `fd`, a listening socket, to TCPStore (LibTorch 2.1+: TCPStoreOptions::masterListenFd; it closes the fd
/// when the store ends). LibTorch 2.4 - 2.7's default libuv server cannot serve a handed socket (it never listened
/// on it: fixed in 2.8 by pytorch#150215), so there the store runs on the classic server. A template, so that 1.13,
/// whose options have neither member, compiles the empty branch only.
template <class Options>
void hand_over_listener(Options& options, int fd) {
  if constexpr (torch_at_least(2, 1)) {
    options.masterListenFd = fd;
    if constexpr (!torch_at_least(2, 8)) options.useLibUV = false;
  }
}

/// The name of this host's loopback interface ("lo" on Linux).
inline std::string loopback_interface() {
  ifaddrs* interfaces = nullptr;
  std::string name = "lo";
  if (::getifaddrs(&interfaces) != 0) return name;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next)
    if ((i->ifa_flags & IFF_LOOPBACK) != 0) {
      name = i->ifa_name;
      break;
    }
  ::freeifaddrs(interfaces);
  return name;
}

/// This process's TCP sockets that listen on `port` (any address): found through /proc/self/fd.
inline std::vector<int> listening_sockets(int port) {
  std::vector<int> found;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int fd = std::stoi(name);
    int listening = 0, protocol = 0;
    socklen_t size = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || listening == 0) continue;
    size = sizeof protocol;
    if (::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &size) != 0 || protocol != IPPROTO_TCP) continue;
    socket_address local;
    local.length = sizeof local.storage;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local.storage), &local.length) != 0) continue;  // NOLINT
    const std::uint16_t bound = local.family() == AF_INET
                                    ? reinterpret_cast<const sockaddr_in&>(local.storage).sin_port     // NOLINT
                                    : reinterpret_cast<const sockaddr_in6&>(local.storage).sin6_port;  // NOLINT
    if ((local.family() == AF_INET || local.family() == AF_INET6) && ntohs(bound) == port) found.push_back(fd);
  }
  return found;
}

/// LibTorch before 2.1 listens on every interface ([::]:port) and takes no socket of ours: this binds the store's
/// socket to the loopback interface (SO_BINDTODEVICE; unprivileged since Linux 5.7), so that only this host can
/// connect: what a loopback MASTER_ADDR promises. The socket is found by its port: the only TCP socket of the
/// process listening on MASTER_PORT, which the store holds. Connections accepted between LibTorch's listen() and
/// this call (microseconds) stay. Throws distributed_error when the socket is missing or the option refused for
/// another reason than a kernel before 5.7 (EPERM for an unprivileged process): there the run goes on with the
/// store on every interface, as LibTorch 1.13 leaves it, after one warning line on `log`, since refusing would
/// end every single-host run on such a kernel (RHEL 8's 4.18, say) for an exposure it had always had.
inline void restrict_to_loopback_interface(int port, const std::string& where, std::ostream& log = std::cerr) {
  const std::string device = loopback_interface();
  const std::vector<int> sockets = listening_sockets(port);
  if (sockets.empty())
    throw distributed_error("rank 0 found no socket listening on port " + std::to_string(port) +
                            " to keep the store at " + where + " on the loopback interface");
  for (const int fd : sockets) {
    if (::setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, device.c_str(), static_cast<socklen_t>(device.size())) == 0)
      continue;
    const int error = errno;
    const std::string why = "SO_BINDTODEVICE: " + std::string(std::strerror(error)) +
                            " (LibTorch 1.13 listens on every interface; Linux 5.7+ allows this unprivileged)";
    if (error != EPERM)
      throw distributed_error("rank 0 cannot keep the store at " + where + " on the loopback interface " + device +
                              ": " + why);
    log << "warning: rank 0's store at " << where << " listens on every interface: " << why << "; keep port " << port
        << " behind a firewall\n";
    return;
  }
}

}  // namespace detail

/// One rank of a group of processes over c10d: a Communicator (communicator.hpp) plus all_reduce_sum of tensors.
/// Every collective must be called by every rank in the same order, from one thread. While it lives, an exception
/// escaping one of c10d's threads, a destructor or a noexcept function ends the process with one line and exit
/// status 1, and SIGPIPE is ignored (detail::lost_peer_guard): a lost peer never aborts a rank.
/// Example (2 ranks, started by torchrun or run_ranks.sh):
///   c10d_communicator comm(*launch_environment_from_process(), {.timeout_seconds = 60});
///   std::vector<double> rewards{comm.rank() + 1.0};
///   comm.all_reduce_sum(rewards);            // {3} on both ranks
///   comm.all_reduce_sum(gradients);          // std::vector<torch::Tensor>, in place on their device
class c10d_communicator {
 public:
  /// Joins the group: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT (torchrun's agent does with
  /// agent_store), every rank waits for the others, then Gloo (and NCCL) connect through the store.
  /// Throws distributed_error naming the ranks that did not join within the timeout, or when the store cannot be
  /// hosted or reached; invalid_input when options are out of range.
  /// @post rank() == environment.rank, size() == environment.world_size.
  explicit c10d_communicator(const launch_environment& environment, const distributed_options& options = {})
      : environment_(environment) {
    require(std::isfinite(options.timeout_seconds) && options.timeout_seconds >= 1 && options.timeout_seconds <= 86400,
            "distributed timeout_seconds = ", options.timeout_seconds, ": must be in [1, 86400]");
    require(environment.world_size >= 1 && environment.rank >= 0 && environment.rank < environment.world_size, "rank ",
            environment.rank, " is not in a group of ", environment.world_size);
    timeout_ = std::chrono::milliseconds(static_cast<std::int64_t>(options.timeout_seconds * 1000));
    // The fault report's share of the timeout: a tenth, within [0.5 s, 5 s].
    grace_ = std::clamp(timeout_ / 10, std::chrono::milliseconds(500), std::chrono::milliseconds(5000));
    const std::string who = "rank " + std::to_string(rank());
    lost_peer_.describe(who + " lost its connection to " + store_host() + ": it died or the network failed",
                        who + " lost the group outside a collective: a rank died or the network failed");
    const detail::quiet_torch_log quiet;  // the join's errors are our one line
    connect_store();
    wait_for_ranks();
    connect_groups(options);
  }

  [[nodiscard]] int rank() const { return environment_.rank; }
  [[nodiscard]] int size() const { return environment_.world_size; }
  /// Whether a collective failed (a rank died or hangs): every later one throws "the group is unusable", so a caller
  /// that caught the failure rethrows it rather than trying another collective.
  [[nodiscard]] bool broken() const { return broken_ != 0; }
  [[nodiscard]] int local_rank() const { return environment_.local_rank; }
  /// This rank's device: CUDA device LOCAL_RANK when CUDA is available, else the CPU.
  [[nodiscard]] torch::Device device() const { return device_; }
  [[nodiscard]] const launch_environment& environment() const { return environment_; }
  /// Collectives run so far (the number the fault messages give).
  [[nodiscard]] std::int64_t collectives() const { return sequence_; }

  /// Every rank's `values` become their element-wise sum over the ranks (in float64, over Gloo).
  /// @pre every rank passes the same values.size().
  void all_reduce_sum(std::span<double> values) {
    collective("all_reduce", [&] {
      if (values.empty()) return;
      std::vector<torch::Tensor> tensors{torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())},
                                                          torch::TensorOptions().dtype(torch::kFloat64))};
      gloo_->allreduce(tensors)->wait();
    });
  }

  /// Every tensor becomes its element-wise sum over the ranks, in place on its device (gradients: divide by
  /// size() for the mean). One collective per dtype, over the tensors flattened into one buffer; CUDA tensors go
  /// through NCCL where LibTorch has it, else through a host copy and Gloo.
  /// Example: 2 ranks with {[1, 2], [[3]]} and {[10, 20], [[30]]} -> {[11, 22], [[33]]} on both.
  /// @pre every rank passes tensors of the same count, shapes and dtypes; all defined, on one device.
  void all_reduce_sum(std::vector<torch::Tensor>& tensors) {
    if (tensors.empty()) return;
    for (const torch::Tensor& t : tensors) {
      require(t.defined(), "all_reduce_sum: an undefined tensor (a parameter without a gradient?)");
      require(t.device() == tensors.front().device(), "all_reduce_sum: tensors on ", tensors.front().device(), " and ",
              t.device());
    }
    torch::NoGradGuard no_grad;
    std::vector<torch::ScalarType> dtypes;  // in order of first appearance: the same order on every rank
    for (const torch::Tensor& t : tensors)
      if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end()) dtypes.push_back(t.scalar_type());
    for (const torch::ScalarType dtype : dtypes) {
      std::vector<torch::Tensor> group;
      for (const torch::Tensor& t : tensors)
        if (t.scalar_type() == dtype) group.push_back(t);
      reduce_group(group);
    }
  }

  /// Rank `root`'s `tensor` becomes the element-wise sum over the ranks; the others' are left unspecified (Gloo
  /// uses them as scratch). The reduce-scatter of sharded gradients (ZeRO-2) is one of these per owner of a bucket:
  /// LibTorch 1.13's ProcessGroupGloo has no reduce_scatter ("does not support reduce_scatter"), and a reduce to
  /// the owner moves what a reduce-scatter moves, in more and smaller messages.
  /// Example: 2 ranks with [1, 2] and [10, 20], root 1 -> rank 1 holds [11, 22].
  /// @pre every rank passes a contiguous tensor of the same shape and dtype, and the same root in [0, size()).
  void reduce_sum_to(torch::Tensor& tensor, int root) {
    require(root >= 0 && root < size(), "reduce_sum_to: root ", root, " is not in a group of ", size());
    require(tensor.defined() && tensor.is_contiguous(), "reduce_sum_to: an undefined or non-contiguous tensor");
    torch::NoGradGuard no_grad;
    const bool on_cuda = tensor.device().is_cuda();
    collective("reduce", [&] {
      c10d::ReduceOptions options;
      options.rootRank = root;
#if defined(BRANCHGRPO_C10D_NCCL)
      if (on_cuda && nccl_) {
        std::vector<torch::Tensor> buffer{tensor};
        nccl_->reduce(buffer, options)->wait();
        return;
      }
#endif
      std::vector<torch::Tensor> buffer{on_cuda ? tensor.to(torch::kCPU) : tensor};
      gloo_->reduce(buffer, options)->wait();
      if (on_cuda && rank() == root) tensor.copy_(buffer.front());
    });
  }

  /// gathered = the ranks' `local` tensors, concatenated in rank order (the all-gather of updated shards).
  /// Example: 2 ranks with [1, 2] and [3, 4] -> [1, 2, 3, 4] on both.
  /// @pre every rank passes a 1-D `local` of the same length and dtype; `gathered` is contiguous, 1-D, of that
  ///      dtype, on the same device, with local.numel() * size() elements.
  void all_gather(const torch::Tensor& local, torch::Tensor& gathered) {
    require(local.dim() == 1 && gathered.dim() == 1 && gathered.is_contiguous() &&
                gathered.numel() == local.numel() * size() && gathered.scalar_type() == local.scalar_type(),
            "all_gather: ", gathered.numel(), " elements for ", size(), " ranks of ", local.numel());
    torch::NoGradGuard no_grad;
    const bool on_cuda = local.device().is_cuda();
    collective("all_gather", [&] {
      if (local.numel() == 0) return;
#if defined(BRANCHGRPO_C10D_NCCL)
      if (on_cuda && nccl_) {
        std::vector<torch::Tensor> input{local.contiguous()};
        std::vector<std::vector<torch::Tensor>> output(1);
        for (int r = 0; r < size(); ++r) output[0].push_back(gathered.narrow(0, r * local.numel(), local.numel()));
        nccl_->allgather(output, input)->wait();
        return;
      }
#endif
      torch::Tensor host =
          on_cuda ? torch::empty({gathered.numel()}, gathered.options().device(torch::kCPU)) : gathered;
      std::vector<torch::Tensor> input{local.to(torch::kCPU).contiguous()};
      std::vector<std::vector<torch::Tensor>> output(1);
      for (int r = 0; r < size(); ++r) output[0].push_back(host.narrow(0, r * local.numel(), local.numel()));
      gloo_->allgather(output, input)->wait();
      if (on_cuda) gathered.copy_(host);
    });
  }

  /// gathered = the ranks' `local` bytes in rank order.
  /// @pre every rank passes the same local.size(); gathered.size() == local.size() * size().
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) {
    require(gathered.size() == local.size() * static_cast<std::size_t>(size()), "all_gather: ", gathered.size(),
            " bytes for ", size(), " ranks of ", local.size());
    collective("all_gather", [&] {
      if (local.empty()) return;
      const auto count = static_cast<std::int64_t>(local.size());
      const auto bytes = torch::TensorOptions().dtype(torch::kUInt8);
      // Gloo only reads its input: the const_cast lends the caller's bytes without a copy.
      std::vector<torch::Tensor> input{
          torch::from_blob(const_cast<std::byte*>(local.data()), {count}, bytes)};  // NOLINT
      std::vector<std::vector<torch::Tensor>> output(1);
      for (int r = 0; r < size(); ++r)
        output[0].push_back(
            torch::from_blob(gathered.data() + static_cast<std::size_t>(r) * local.size(), {count}, bytes));
      gloo_->allgather(output, input)->wait();
    });
  }

  /// Returns when every rank reached it.
  void barrier() {
    collective("barrier", [&] { gloo_->barrier()->wait(); });
  }

 private:
  using store_pointer = c10::intrusive_ptr<c10d::Store>;

  static std::vector<std::uint8_t> bytes_of(std::int64_t value) {
    const std::string text = std::to_string(value);
    return {text.begin(), text.end()};
  }
  static std::string key(std::string_view kind, int rank) { return std::string(kind) + "/" + std::to_string(rank); }
  // The first line of an exception's message (c10::Error appends a backtrace).
  static std::string first_line(const std::exception& error) {
    const std::string text = error.what();
    return text.substr(0, text.find('\n'));
  }
  [[nodiscard]] std::string seconds(std::chrono::milliseconds duration) const {
    std::ostringstream text;
    text << static_cast<double>(duration.count()) / 1000 << " s";
    return text.str();
  }
  [[nodiscard]] std::string store_address() const {
    return environment_.master_addr + ":" + std::to_string(environment_.master_port);
  }
  [[nodiscard]] std::string store_host() const {
    return environment_.agent_store ? "the store at " + store_address() + " (torchrun's agent)"
                                    : "rank 0 (the store at " + store_address() + ")";
  }

  // The group's fault `text`: the error to throw, and the line the process ends with should an exception escape a
  // c10d thread or a destructor before this communicator is gone (detail::lost_peer_guard).
  distributed_error fault(const std::string& text) {
    lost_peer_.record_fault(text);
    return distributed_error(text);
  }

  // Rank 0 hosts the store on the address MASTER_ADDR names (the header comment's "Exposure"); every rank then
  // connects to it.
  void connect_store() {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(environment_.master_port);
    options.isServer = !environment_.agent_store && rank() == 0;
    options.numWorkers = static_cast<std::size_t>(size());
    options.waitWorkers = false;  // wait_for_ranks names the missing ones
    options.timeout = timeout_;
    // Rank 0 waits for its name to resolve (it starts the store itself), every other rank for the store to accept.
    if (const std::optional<detail::store_unreachable> failure =
            detail::wait_for_store(environment_.master_addr, environment_.master_port, !options.isServer,
                                   std::chrono::steady_clock::now() + timeout_))
      throw fault(unreachable_text(*failure));
    const std::optional<detail::socket_address> bind_address =
        options.isServer ? detail::store_bind_address(environment_.master_addr) : std::nullopt;
    constexpr bool takes_listener = torch_at_least(2, 1);
    const std::string where = "MASTER_ADDR:MASTER_PORT = " + store_address();
    detail::unique_fd listener;
    if (takes_listener && bind_address) {
      listener = detail::listen_on(*bind_address, environment_.master_port, where);
      // TCPStore gets a copy to own and close; ours closes below whether or not TCPStore took its copy (when the
      // constructor throws, that copy may leak: the process is ending with the error).
      const int copy = ::fcntl(listener.get(), F_DUPFD_CLOEXEC, 0);
      if (copy < 0) throw fault("rank 0 cannot host the store at " + where + ": " + std::strerror(errno));
      detail::hand_over_listener(options, copy);
    }
    try {
      tcp_store_ = c10::make_intrusive<c10d::TCPStore>(environment_.master_addr, options);
    } catch (const std::exception& error) {
      if (options.isServer) throw fault("rank 0 cannot host the store at " + where + ": " + first_line(error));
      throw fault(unreachable_text({.resolved = true, .reason = first_line(error)}));
    }
    listener.reset();
    if (!takes_listener && bind_address && bind_address->loopback())
      detail::restrict_to_loopback_interface(environment_.master_port, where);
    store_ = c10::make_intrusive<c10d::PrefixStore>("branchgrpo/attempt_" + std::to_string(environment_.restart_count),
                                                    tcp_store_);
  }

  // Why this rank could not reach the store, in one line that names MASTER_ADDR.
  // Example: "rank 1 could not reach the store at MASTER_ADDR = 'no-such-host.invalid' within 5 s: the name does
  //   not resolve (Name or service not known)"; "rank 1 could not reach rank 0's store at MASTER_ADDR:MASTER_PORT =
  //   127.0.0.1:29500 within 5 s: Connection refused".
  [[nodiscard]] std::string unreachable_text(const detail::store_unreachable& failure) const {
    const std::string who = "rank " + std::to_string(rank());
    if (!failure.resolved)
      return who + " could not reach the store at MASTER_ADDR = '" + echo_text(environment_.master_addr) + "' within " +
             seconds(timeout_) + ": the name does not resolve (" + failure.reason + ")";
    return who + " could not reach " + (environment_.agent_store ? "torchrun's agent store" : "rank 0's store") +
           " at MASTER_ADDR:MASTER_PORT = " + store_address() + " within " + seconds(timeout_) + ": " + failure.reason;
  }

  // Every rank announces itself, then waits for all: a missing rank is named, not reported as a Gloo timeout.
  void wait_for_ranks() {
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(key("joined", r));
    try {
      store_->set(key("joined", rank()), bytes_of(1));
      store_->wait(keys, timeout_);
    } catch (const std::exception& error) {
      std::vector<int> missing;
      try {
        for (int r = 0; r < size(); ++r)
          if (!store_->check({keys[static_cast<std::size_t>(r)]})) missing.push_back(r);
      } catch (const std::exception&) {
        throw fault("rank " + std::to_string(rank()) + " lost " + store_host() + " while the ranks joined: it died (" +
                    first_line(error) + ")");
      }
      if (missing.empty()) throw fault("joining the group failed: " + first_line(error));
      throw fault(ranks_text(missing) + " did not join the group at " + store_address() + " within " +
                  seconds(timeout_) + ": not started, or died");
    }
  }

  void connect_groups(const distributed_options& options) {
    const auto collective_timeout = timeout_ - grace_;
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(collective_timeout);
    std::string interface = options.gloo_interface;
    if (interface.empty())
      if (const char* variable = std::getenv("GLOO_SOCKET_IFNAME")) interface = variable;
    const std::string& address = environment_.master_addr;
    const bool loopback = detail::is_loopback_master(address);
    try {
      gloo_options->devices.push_back(!interface.empty() ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
                                      : loopback         ? c10d::ProcessGroupGloo::createDeviceForHostname(address)
                                                         : c10d::ProcessGroupGloo::createDefaultDevice());
      gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store_),
                                                          rank(), size(), gloo_options);
    } catch (const std::exception& error) {
      // Gloo's error names an address, not a rank: when the store is gone too, its host died meanwhile.
      bool store_alive = true;
      try {
        (void)store_->check({key("joined", rank())});
      } catch (const std::exception&) {
        store_alive = false;
      }
      if (!store_alive)
        throw fault("rank " + std::to_string(rank()) + " lost " + store_host() + " while Gloo connected: it died (" +
                    first_line(error) + ")");
      throw fault("rank " + std::to_string(rank()) + " could not connect Gloo to the other ranks" +
                  (interface.empty() ? "" : " on interface " + interface) + ": " + first_line(error));
    }
    if (torch::cuda::is_available()) {
      const auto devices = static_cast<int>(torch::cuda::device_count());
      if (environment_.local_rank >= devices)
        throw fault("LOCAL_RANK = " + std::to_string(environment_.local_rank) + " but this node has " +
                    std::to_string(devices) + " CUDA devices");
      device_ = torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(environment_.local_rank));
    }
#if defined(BRANCHGRPO_C10D_NCCL)
    if (options.nccl && device_.is_cuda()) {
      c10::cuda::set_device(device_.index());
      // Blocking waits: a failed or timed-out NCCL collective then throws in wait(), inside the fault protocol,
      // instead of aborting the process from c10d's watchdog thread (1.13 and 2.x spell the variable differently).
      // The caller's own setting wins.
      setenv("NCCL_BLOCKING_WAIT", "1", 0);
      setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = collective_timeout;
      nccl_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store_),
                                                          rank(), size(), nccl_options);
    }
#endif
  }

  // Same-dtype tensors, reduced as one flat buffer (or in place when there is one contiguous tensor).
  void reduce_group(std::vector<torch::Tensor>& group) {
    const bool alone = group.size() == 1 && group.front().is_contiguous();
    torch::Tensor flat = alone ? group.front() : torch::cat(flatten(group));
    const bool on_cuda = flat.device().is_cuda();
    collective("all_reduce", [&] {
#if defined(BRANCHGRPO_C10D_NCCL)
      if (on_cuda && nccl_) {
        std::vector<torch::Tensor> buffer{flat};
        nccl_->allreduce(buffer)->wait();
        return;
      }
#endif
      std::vector<torch::Tensor> buffer{on_cuda ? flat.to(torch::kCPU) : flat};
      gloo_->allreduce(buffer)->wait();
      if (on_cuda) flat.copy_(buffer.front());
    });
    if (alone) return;
    std::int64_t offset = 0;
    for (torch::Tensor& t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
  static std::vector<torch::Tensor> flatten(const std::vector<torch::Tensor>& group) {
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& t : group) flat.push_back(t.reshape({-1}));
    return flat;
  }

  // Runs one collective under the fault protocol (see the header comment).
  template <class Run>
  void collective(std::string_view what, Run&& run) {
    const std::int64_t number = ++sequence_;
    if (broken_ != 0)
      throw fault("collective " + std::to_string(number) + " (" + std::string(what) + ") after collective " +
                  std::to_string(broken_) + " failed: the group is unusable");
    try {
      store_->set(key("entered", rank()), bytes_of(number));
    } catch (const std::exception& error) {
      broken_ = number;
      throw fault(store_host() + " is unreachable before collective " + std::to_string(number) + " (" +
                  std::string(what) + "): it died or hangs (" + first_line(error) + ")");
    }
    try {
      run();
    } catch (const std::exception& error) {
      broken_ = number;
      throw fault(diagnose(number, what, first_line(error)));
    }
  }

  // Who is to blame for collective `number` failing here with `cause`: the ranks that report no failure of their
  // own within the grace. Ends early once every other rank reported.
  std::string diagnose(std::int64_t number, std::string_view what, const std::string& cause) {
    const std::string collective_text =
        "collective " + std::to_string(number) + " (" + std::string(what) + ", timeout " + seconds(timeout_) + ")";
    const detail::quiet_torch_log quiet;  // store calls to a dead host: our line says so
    try {
      store_->set(key("failed", rank()), bytes_of(number));
      const auto deadline = std::chrono::steady_clock::now() + grace_;
      std::vector<int> silent;
      while (true) {
        silent.clear();
        for (int r = 0; r < size(); ++r)
          if (r != rank() && !store_->check({key("failed", r)})) silent.push_back(r);
        if (silent.empty() || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      store_->set(key("diagnosed", rank()), bytes_of(number));
      if (!environment_.agent_store && rank() == 0) linger_for_reports();
      if (silent.empty()) return collective_text + " failed on every rank: " + cause;
      std::vector<int> absent, inside;  // did not reach the collective / died or hang inside it
      for (const int r : silent) {
        const std::string entered = key("entered", r);
        std::int64_t last = 0;
        if (store_->check({entered})) {
          const std::vector<std::uint8_t> value = store_->get(entered);
          last = std::stoll(std::string(value.begin(), value.end()));
        }
        (last < number ? absent : inside).push_back(r);
      }
      std::string text;
      if (!absent.empty()) text = ranks_text(absent) + " did not reach " + collective_text;
      if (!inside.empty())
        text += (text.empty() ? "" : "; ") + ranks_text(inside) + " stopped inside " + collective_text;
      return text + ": " + (silent.size() == 1 ? "it died or hangs" : "they died or hang") + " (rank " +
             std::to_string(rank()) + ": " + cause + ")";
    } catch (const std::exception& error) {
      return store_host() + " is unreachable after " + collective_text + " failed on rank " + std::to_string(rank()) +
             ": it died or hangs (" + cause + ")";
    }
  }

  // Rank 0 hosts the store: it stays until the ranks that reported a failure have read the reports (at most one
  // more grace), so that they do not mistake its exit for the fault.
  void linger_for_reports() {
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    while (std::chrono::steady_clock::now() < deadline) {
      bool done = true;
      for (int r = 1; r < size() && done; ++r)
        done = !store_->check({key("failed", r)}) || store_->check({key("diagnosed", r)});
      if (done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  launch_environment environment_;
  std::chrono::milliseconds timeout_{}, grace_{};
  // Before the c10d objects: alive until their destructors (which join their threads) are done.
  detail::lost_peer_guard lost_peer_;
  c10::intrusive_ptr<c10d::TCPStore> tcp_store_;
  store_pointer store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
#if defined(BRANCHGRPO_C10D_NCCL)
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_;
#endif
  torch::Device device_ = torch::kCPU;
  std::int64_t sequence_ = 0;
  std::int64_t broken_ = 0;  // the collective that failed; 0 while the group works
};

/// The process's group when launched as several processes (WORLD_SIZE set), else nullopt: one process, as before.
/// Example: torchrun --nproc_per_node 2 ... -> a c10d_communicator on each; plain `branchgrpo train` -> nullopt.
/// Throws invalid_input for a malformed environment, distributed_error when joining fails.
inline std::optional<c10d_communicator> communicator_from_environment(const distributed_options& options = {}) {
  const std::optional<launch_environment> environment = launch_environment_from_process();
  if (!environment) return std::nullopt;
  return std::optional<c10d_communicator>(std::in_place, *environment, options);
}

/// XXH64 over the tensors' dtypes, shapes and values (host copies, contiguous): equal on two ranks exactly when
/// the tensors are bit-identical.
/// Example: parameters_digest({torch::zeros({2})}) differs from parameters_digest({torch::zeros({3})}).
inline std::uint64_t parameters_digest(std::span<const torch::Tensor> tensors) {
  xxh64 hash;
  for (const torch::Tensor& t : tensors) {
    const torch::Tensor host = t.detach().to(torch::kCPU).contiguous();
    const auto dtype = static_cast<std::int64_t>(host.scalar_type());
    hash.update(&dtype, sizeof dtype);
    for (const std::int64_t extent : host.sizes()) hash.update(&extent, sizeof extent);
    hash.update(host.data_ptr(), host.nbytes());
  }
  return hash.digest();
}

/// Debug check that data-parallel replicas did not drift: throws invalid_input on every rank
/// "the ranks run different parameters: rank 0 xxh64 ..., rank 1 xxh64 ..." when their tensors differ.
/// @pre a collective: every rank calls it at the same point.
template <Communicator C>
void check_same_parameters(C& communicator, std::span<const torch::Tensor> tensors) {
  check_same_everywhere(communicator, parameters_digest(tensors), "parameters");
}

}  // namespace branchgrpo
