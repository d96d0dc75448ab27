#pragma once
// One exception type for every rejected input. Messages are a single line that names the bad value,
// e.g. "split step 25 is not below the number of steps 20".
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace branchgrpo {

/// Thrown for any invalid configuration, shape or value handed to the library.
class invalid_input : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Builds the one-line message from its parts: fail("split step ", s, " is not below ", n).
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw invalid_input(message.str());
}

/// fail(...) unless `condition` holds.
template <class... Parts>
void require(bool condition, Parts&&... parts) {
  if (!condition) fail(std::forward<Parts>(parts)...);
}

}  // namespace branchgrpo
