#pragma once
// SIGINT / SIGTERM for every command: the first signal only records a stop request (<branchgrpo/core/stop.hpp>),
// which every long loop checks between chunks (check_stop throws stop_requested, main turns it into one line and
// exit 128 + signal; `train` saves the last finished iteration first). The handler then restores the default
// action for both signals, so a second signal ends the process at once.
//
//   stop_signals stop;                  handlers installed (the previous ones restored by the destructor)
//   while (...) { ...; if (stop.received() != 0) { ...; std::exit(128 + stop.received()); } }
#include <signal.h>

#include <csignal>
#include <string>

#include "branchgrpo/core/stop.hpp"

namespace branchgrpo::cli {

namespace signal_detail {
extern "C" inline void record_stop_signal(int signal) {
  branchgrpo::request_stop(signal);  // a lock-free atomic: async-signal-safe
  // Async-signal-safe: sigaction is on POSIX's list. The next SIGINT / SIGTERM takes the default action.
  struct ::sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  ::sigemptyset(&fallback.sa_mask);
  ::sigaction(SIGINT, &fallback, nullptr);
  ::sigaction(SIGTERM, &fallback, nullptr);
}
}  // namespace signal_detail

/// "SIGINT", "SIGTERM", else "signal N".
inline std::string signal_name(int signal) { return branchgrpo::stop_signal_name(signal); }

/// Catches SIGINT and SIGTERM for its lifetime (see the file comment). One at a time.
class stop_signals {
 public:
  stop_signals() {
    struct ::sigaction action {};
    action.sa_handler = signal_detail::record_stop_signal;
    ::sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // reads and writes in progress continue; the loop looks at the flag
    ::sigaction(SIGINT, &action, &previous_int_);
    ::sigaction(SIGTERM, &action, &previous_term_);
  }
  ~stop_signals() {
    ::sigaction(SIGINT, &previous_int_, nullptr);
    ::sigaction(SIGTERM, &previous_term_, nullptr);
  }
  stop_signals(const stop_signals&) = delete;
  stop_signals& operator=(const stop_signals&) = delete;

  /// The signal received (by this or an earlier stop_signals), or 0.
  [[nodiscard]] int received() const { return branchgrpo::stop_signal(); }

 private:
  struct ::sigaction previous_int_ {};
  struct ::sigaction previous_term_ {};
};

}  // namespace branchgrpo::cli
