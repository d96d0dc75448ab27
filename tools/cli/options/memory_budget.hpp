#pragma once
// Sizes from the user are checked against the memory they imply before anything of that size is built, so
// `branchgrpo toy --prompts 2000000000` is one line naming the flag, the estimate and the budget, e.g.
// "--prompts = 2000000000: the rollout needs about 61 TB (limit: physical memory 24 GB)", not std::bad_alloc
// (or the OOM killer) minutes later. Torch-free; the commands estimate, this file compares.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"

namespace branchgrpo::cli {

/// The memory this process may use: the smallest of the physical memory (sysconf) and the soft RLIMIT_AS and
/// RLIMIT_DATA limits (`ulimit -v`, `ulimit -d`), with the name of the one that binds (core/memory.hpp's budget).
/// Example: under `ulimit -v 2000000` on a 24 GB machine -> {2.05e9, "address-space limit (ulimit -v)"}.
inline memory_budget available_memory() {
  memory_budget budget;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0)
    budget = {static_cast<double>(pages) * static_cast<double>(page_size), "physical memory"};
  const auto limit = [&budget](int resource, const char* name) {
    struct ::rlimit value {};
    if (::getrlimit(resource, &value) == 0 && value.rlim_cur != RLIM_INFINITY &&
        static_cast<double>(value.rlim_cur) < budget.bytes)
      budget = {static_cast<double>(value.rlim_cur), name};
  };
  limit(RLIMIT_AS, "address-space limit (ulimit -v)");
  limit(RLIMIT_DATA, "data-size limit (ulimit -d)");
  return budget;
}

/// require_fits (core/memory.hpp) against available_memory(). `setting` names the flag and its value.
/// Example: require_fits(1.2e12, "--prompts = 2000000000", "the rollout") throws
///   "--prompts = 2000000000: the rollout needs about 1.2 TB (limit: physical memory 24 GB)".
inline void require_fits(double bytes, std::string_view setting, std::string_view what) {
  branchgrpo::require_fits(bytes, available_memory(), setting, what);
}

/// Bytes one rollout-tree node costs an iteration of the 2-D toy (`toy`, `bench iteration --model toy`) at its
/// peak: measured 113 (branch) to 128 (dance) from the peak RSS of `toy --iters 1` at 200 and 2000 prompts (the
/// node's latent, noise and log-probabilities, its edge in the update batch, the trainer's bookkeeping), doubled
/// so that the estimate stays above what a run takes: a refusal is a run that would not fit.
inline constexpr double toy_bytes_per_node = 256;

/// "<flag> = <value>" for require_fits. Example: setting_text("--prompts", 8) == "--prompts = 8".
inline std::string setting_text(std::string_view flag, std::int64_t value) {
  return std::string(flag) + " = " + std::to_string(value);
}

}  // namespace branchgrpo::cli
