#pragma once
// The exception types of a one-line error, by whose fault it is (the CLI's exit status follows them,
// docs/reliability.md "Exit status"):
//   invalid_input    a rejected input, refused before the run starts: "split step 25 is not below the number of
//                    steps 20" (exit 2)
//   system_failure   something outside the input failed while the run went on: a server, a peer, the file
//                    system (exit 1)
// Messages are a single line that names the bad value, the key, the file or the url.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace branchgrpo {

namespace detail {
// The parts streamed into one string.
template <class... Parts>
std::string message_of(Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  return message.str();
}
}  // namespace detail

/// Thrown for any invalid configuration, shape or value handed to the library.
class invalid_input : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a server, a peer or the file system failed during a run that its inputs had let start.
/// Example: a reward server answering HTTP 500 at iteration 3 -> system_failure "remote reward
///   http://127.0.0.1:8000/score: HTTP 500: scorer crashed (after 3 attempts)".
class system_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Builds the one-line message from its parts: fail("split step ", s, " is not below ", n).
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw invalid_input(detail::message_of(std::forward<Parts>(parts)...));
}

/// fail(...)'s system_failure: fail_system(url, ": HTTP 500: ", why).
template <class... Parts>
[[noreturn]] void fail_system(Parts&&... parts) {
  throw system_failure(detail::message_of(std::forward<Parts>(parts)...));
}

/// Runs a check made before a run starts: a system_failure there (a server that does not answer the start-up
/// check) is the run's refusal, an invalid_input with the same line; everything else passes through.
/// Example: as_refusal([] { fail_system("remote reward http://127.0.0.1:9/info: Connection refused"); }) throws
///   invalid_input "remote reward http://127.0.0.1:9/info: Connection refused".
template <class Check>
decltype(auto) as_refusal(Check&& check) {
  try {
    return std::forward<Check>(check)();
  } catch (const system_failure& failure) {
    throw invalid_input(failure.what());
  }
}

/// fail(...) unless `condition` holds.
template <class... Parts>
void require(bool condition, Parts&&... parts) {
  if (!condition) fail(std::forward<Parts>(parts)...);
}

}  // namespace branchgrpo
