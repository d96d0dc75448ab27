// A test's fault: preloaded (LD_PRELOAD) into one rank of `branchgrpo train`, it kills that process with SIGKILL
// when the process renames a file onto a path containing $BRANCHGRPO_TEST_KILL_ON_RENAME, before the rename
// happens. write_safetensors renames each finished file into place, so
// BRANCHGRPO_TEST_KILL_ON_RENAME=iter-000004.tmp/shard-00001 kills rank 1 in the middle of writing checkpoint 4:
// its shard is written but not in place, and no manifest exists (tests/distributed/train_ranks.sh zero_killed).
// Nothing of it is linked into the library or the tool.
#include <dlfcn.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

extern "C" int rename(const char* from, const char* to) {
  using rename_fn = int (*)(const char*, const char*);
  static const auto real = reinterpret_cast<rename_fn>(dlsym(RTLD_NEXT, "rename"));
  const char* pattern = std::getenv("BRANCHGRPO_TEST_KILL_ON_RENAME");
  if (pattern != nullptr && *pattern != '\0' && to != nullptr && std::strstr(to, pattern) != nullptr)
    std::raise(SIGKILL);
  return real(from, to);
}
