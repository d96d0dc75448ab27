// branchgrpo::torch alone, from the installed package (LibTorch): a torch_backend on the CPU computes one affine
// combination of a [3, 2] batch; fails unless it matches the host arithmetic.
#include <branchgrpo/torch/backend.hpp>

#include <array>
#include <iostream>
#include <vector>

static_assert(branchgrpo::Backend<branchgrpo::torch_backend>);

int main() {
  const branchgrpo::torch_backend backend;
  const std::array<double, 6> values = {1, 2, 3, 4, 5, 6};
  const torch::Tensor x = backend.from_host(values, 3, branchgrpo::latent_shape{{2}});
  const std::vector<double> y = backend.to_host(backend.affine(2, x, -1, x));  // 2 x - x == x
  std::cout << "torch_backend: " << x.sizes() << ' ' << x.dtype() << ", affine(2, x, -1, x)[5] = " << y[5] << '\n';
  return y == std::vector<double>(values.begin(), values.end()) ? 0 : 1;
}
