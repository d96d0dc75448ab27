// branchgrpo::model_specs alone, from the installed package (no LibTorch): the FLUX.1-dev transformer has 780
// tensors in the bfl layout and 1160 in diffusers (split q/k/v).
#include <branchgrpo/model_specs/flux/config.hpp>
#include <branchgrpo/model_specs/flux/layout.hpp>

#include <iostream>

int main() {
  const branchgrpo::flux_config dev = branchgrpo::flux_config::dev();
  branchgrpo::validate(dev);
  const auto bfl = branchgrpo::flux_expected_tensors(dev, branchgrpo::flux_layout::bfl);
  const auto diffusers = branchgrpo::flux_expected_tensors(dev, branchgrpo::parse_flux_layout("diffusers"));
  std::cout << "flux dev: " << bfl.size() << " tensors in bfl, " << diffusers.size() << " in diffusers\n";
  return bfl.size() == 780 && diffusers.size() == 1160 && dev.head_dim() == 128 ? 0 : 1;
}
