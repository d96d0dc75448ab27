#pragma once
// A cooperative stop request: the one check every long loop calls between chunks of work.
//
//   request_stop(SIGTERM);                 from a signal handler (async-signal-safe), or a host (Python's Ctrl-C)
//   check_stop("the held-out evaluation")  in a loop: throws stop_requested
//                                          "stopped by SIGTERM during the held-out evaluation"
//   clear_stop();                          forget the request (a test, or a host that carries on)
//
// Who checks (each between two chunks, never inside an optimizer update, so that what a loop leaves behind is
// the state before the chunk): the rollout engine before each denoiser call, the ODE sampler before each
// batch's step, the trainer before decoding / scoring each chunk, the reward clients between requests and while
// waiting for an answer, the LoRA export per tensor, `pretrain` per step and `compare` per run and iteration.
// A stop therefore ends any of them within one chunk's time (seconds on the CPU), and the caller (the CLI's
// train, main) turns stop_requested into one line and exit status 128 + signal.
//
// Core header: the standard library only. The flag is one process-wide lock-free atomic (a signal handler may
// write it; C++17 [support.signal] allows lock-free atomics there).
#include <atomic>
#include <csignal>
#include <stdexcept>
#include <string>
#include <string_view>

namespace branchgrpo {

namespace detail {
// The signal of the first stop request (0: none). One object per program (an inline variable).
inline std::atomic<int> stop_request{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");
}  // namespace detail

/// "SIGINT", "SIGTERM", else "signal N". Example: stop_signal_name(15) -> "SIGTERM" on Linux.
inline std::string stop_signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "signal " + std::to_string(signal);
}

/// Thrown by check_stop: a stop was requested while a long loop ran. Not an invalid_input (the input was fine)
/// and not a failure: the CLI exits 128 + signal() with its one-line what().
class stop_requested : public std::runtime_error {
 public:
  stop_requested(int signal, std::string_view where)
      : std::runtime_error("stopped by " + stop_signal_name(signal) + " during " + std::string(where)),
        signal_(signal) {}
  /// The signal that asked for the stop (SIGINT, SIGTERM, or what the host passed to request_stop).
  [[nodiscard]] int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

/// Asks every long loop to stop at its next check. The first request wins; later ones are ignored.
/// Async-signal-safe. Example: request_stop(SIGTERM); request_stop(SIGINT); stop_signal() -> SIGTERM.
/// @pre signal > 0.
inline void request_stop(int signal) noexcept {
  int none = 0;
  detail::stop_request.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

/// The signal of the pending stop request, 0 when there is none.
[[nodiscard]] inline int stop_signal() noexcept { return detail::stop_request.load(std::memory_order_relaxed); }

/// Forgets a pending request. Example: request_stop(SIGINT); clear_stop(); stop_signal() -> 0.
inline void clear_stop() noexcept { detail::stop_request.store(0, std::memory_order_relaxed); }

/// Throws stop_requested naming `where` when a stop is pending; otherwise returns at once (one relaxed load).
/// Example: after request_stop(SIGTERM), check_stop("the rollout") throws "stopped by SIGTERM during the rollout".
/// @post returns only when stop_signal() == 0.
inline void check_stop(std::string_view where) {
  if (const int signal = stop_signal(); signal != 0) throw stop_requested(signal, where);
}

}  // namespace branchgrpo
