#pragma once
// The progress line of `branchgrpo toy`, `train` and `demo` (torch-free, so the toy shares it).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <string>

namespace branchgrpo::cli {

/// One line on stderr, redrawn in place; only on a terminal, and only once the run has taken a second.
/// Example: update(8, "branch 8/16", 0.61, 3.9) on a 16-step run draws
///   [############............] branch 8/16  reward 0.6100  3.90 s/iter
class run_progress {
 public:
  run_progress(bool enabled, int total) : enabled_(enabled && isatty(STDERR_FILENO) != 0), total_(total) {}
  run_progress(const run_progress&) = delete;
  run_progress& operator=(const run_progress&) = delete;
  ~run_progress() { clear(); }

  void update(int done, const std::string& label, double reward, double seconds_per_iter) {
    if (!enabled_ || std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() < 1.0) return;
    constexpr int width = 24;
    const int filled = total_ > 0 ? std::min(width, done * width / total_) : width;
    char numbers[96];
    std::snprintf(numbers, sizeof numbers, "  reward %.4f  %.2f s/iter", reward, seconds_per_iter);
    std::cerr << "\r[" << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << label << numbers << "\033[K"
              << std::flush;
    drawn_ = true;
  }
  void clear() {
    if (!drawn_) return;
    std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }

 private:
  bool enabled_;
  int total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool drawn_ = false;
};

}  // namespace branchgrpo::cli
