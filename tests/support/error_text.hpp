#pragma once
// The one-line message a call throws, for tests that compare error texts.
#include <string>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo::testing {

/// What body() throws as branchgrpo::invalid_input, or "(no error)".
/// Example: error_of([] { fail("bad k ", 0); }) == "bad k 0".
template <class Body>
std::string error_of(const Body& body) {
  try {
    body();
  } catch (const invalid_input& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace branchgrpo::testing
