// branchgrpo::xtensor alone, from the installed package (xtensor): the backend models Backend, and gathers rows of a
// [3, 2] batch as its documentation says.
#include <branchgrpo/xtensor/backend.hpp>

#include <array>
#include <cstdint>
#include <iostream>
#include <vector>

static_assert(branchgrpo::Backend<branchgrpo::xtensor_backend>);

int main() {
  const branchgrpo::xtensor_backend backend;
  const std::array<double, 6> values = {1, 2, 3, 4, 5, 6};
  const std::array<std::int64_t, 3> index = {2, 0, 2};
  const auto x = backend.from_host(values, 3, branchgrpo::latent_shape{{2}});
  const std::vector<double> gathered = backend.to_host(backend.gather_rows(x, index));
  std::cout << "xtensor_backend: gather_rows(x, {2, 0, 2})[0] = " << gathered[0] << '\n';
  return gathered == std::vector<double>{5, 6, 1, 2, 5, 6} ? 0 : 1;
}
