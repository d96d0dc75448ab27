#pragma once
// SIGINT / SIGTERM for long-running commands (`train`): the first signal only sets a flag, which the command checks
// between iterations (finish the current one, write a checkpoint, say so in one line, exit 128 + signal); the
// handler then restores the default action for both signals, so a second signal ends the process at once.
//
//   stop_signals stop;                  handlers installed (the previous ones restored by the destructor)
//   while (...) { ...; if (stop.received() != 0) { ...; std::exit(128 + stop.received()); } }
#include <signal.h>

#include <csignal>
#include <string>

namespace branchgrpo::cli {

namespace detail {
// The first signal received (0: none). sig_atomic_t: the only type a handler may write portably.
inline volatile std::sig_atomic_t received_signal = 0;

extern "C" inline void record_stop_signal(int signal) {
  received_signal = signal;
  // Async-signal-safe: sigaction is on POSIX's list. The next SIGINT / SIGTERM takes the default action.
  struct ::sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  ::sigemptyset(&fallback.sa_mask);
  ::sigaction(SIGINT, &fallback, nullptr);
  ::sigaction(SIGTERM, &fallback, nullptr);
}
}  // namespace detail

/// "SIGINT", "SIGTERM", else "signal N".
inline std::string signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "signal " + std::to_string(signal);
}

/// Catches SIGINT and SIGTERM for its lifetime (see the file comment). One at a time.
class stop_signals {
 public:
  stop_signals() {
    detail::received_signal = 0;
    struct ::sigaction action {};
    action.sa_handler = detail::record_stop_signal;
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

  /// The signal received since construction, or 0.
  [[nodiscard]] int received() const { return detail::received_signal; }

 private:
  struct ::sigaction previous_int_ {};
  struct ::sigaction previous_term_ {};
};

}  // namespace branchgrpo::cli
