// branchgrpo::config alone, from the installed package (toml++, no LibTorch): parses a run configuration from a
// TOML string and checks the keys it set and a default it kept; a bad value must throw one line naming the key.
#include <branchgrpo/config/run_config.hpp>
#include <branchgrpo/core/error.hpp>

#include <iostream>
#include <string>

int main() {
  const branchgrpo::run_config config =
      branchgrpo::parse_run_config("[rollout]\nsteps = 12\n[run]\niterations = 3\n", "consumer.toml");
  std::cout << "run config: rollout.steps = " << config.rollout.steps << ", run.iterations = " << config.run.iterations
            << ", lora.rank = " << config.lora.rank << '\n';
  std::string error;
  try {
    (void)branchgrpo::parse_run_config("[rollout]\nsteps = 0\n", "bad.toml");
  } catch (const branchgrpo::invalid_input& e) {
    error = e.what();
  }
  std::cout << "rejected: " << error << '\n';
  return config.rollout.steps == 12 && config.run.iterations == 3 && config.lora.rank == 16 &&
                 error.find("bad.toml: rollout.steps = 0") != std::string::npos
             ? 0
             : 1;
}
