// libFuzzer target for the safetensors parser (docs/safetensors.md, "Fuzzing"):
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DBRANCHGRPO_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target safetensors_fuzzer
//   build-fuzz/fuzz/safetensors_fuzzer -max_total_time=120 fuzz/corpus-work fuzz/corpus
#include <cstddef>
#include <cstdint>

#include "safetensors_fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return branchgrpo::fuzz::fuzz_safetensors(data, size);
}
