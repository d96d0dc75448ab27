#pragma once
// The tensor collectives of the gradient modes (gradient_modes/*.hpp), over any Communicator by its concrete type:
// a communicator that moves tensors itself (c10d_communicator: all_reduce_sum of tensors, reduce_sum_to, all_gather
// of tensors) does so on their device; any other goes through host doubles and bytes.
//
//   all_reduce_tensors  every tensor becomes its sum over the ranks
//   reduce_tensor_to    a tensor's sum over the ranks reaches rank `root`
//   all_gather_tensor   1-D tensors of equal length, gathered in rank order
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo::detail {

/// Every tensor becomes its sum over the ranks, through the communicator's tensor all-reduce when it has one, else
/// through one buffer of host doubles (exact for float32 and float64 values).
/// Example: 2 ranks with {[1, 2]} and {[3, 4]} -> {[4, 6]} on both; single_process leaves {[1, 2]}.
/// @pre every rank passes tensors of the same count, shapes and dtypes, all defined.
template <Communicator C>
void all_reduce_tensors(C& communicator, std::vector<torch::Tensor>& tensors) {
  if constexpr (requires { communicator.all_reduce_sum(tensors); }) {
    communicator.all_reduce_sum(tensors);
  } else {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& t : tensors) flat.push_back(t.detach().to(torch::kCPU, torch::kFloat64).flatten());
    torch::Tensor host = torch::cat(flat).contiguous();
    communicator.all_reduce_sum(std::span<double>(host.data_ptr<double>(), static_cast<std::size_t>(host.numel())));
    std::int64_t at = 0;
    for (torch::Tensor& t : tensors) {
      t.copy_(host.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

/// `tensor` on rank `root` becomes its sum over the ranks (other ranks' tensors: unspecified afterwards). Without
/// the communicator's reduce_sum_to, an all-reduce, which also leaves the sum on the root.
/// Example: 2 ranks with [1] and [2], root 1 -> rank 1 holds [3].
/// @pre every rank passes a tensor of the same shape and dtype, and the same root.
template <Communicator C>
void reduce_tensor_to(C& communicator, torch::Tensor& tensor, int root) {
  if constexpr (requires { communicator.reduce_sum_to(tensor, root); }) {
    communicator.reduce_sum_to(tensor, root);
  } else {
    std::vector<torch::Tensor> one{tensor};
    all_reduce_tensors(communicator, one);
  }
}

/// `gathered` = every rank's 1-D `local` in rank order, through the communicator's tensor all-gather when it has
/// one, else as bytes through the host.
/// Example: 2 ranks with [1, 2] and [3, 4] -> [1, 2, 3, 4] on both.
/// @pre local is 1-D of the same length and dtype on every rank; gathered has size() times its elements.
template <Communicator C>
void all_gather_tensor(C& communicator, const torch::Tensor& local, torch::Tensor& gathered) {
  if constexpr (requires { communicator.all_gather(local, gathered); }) {
    communicator.all_gather(local, gathered);
  } else {
    const torch::Tensor host = local.detach().to(torch::kCPU).contiguous();
    torch::Tensor all = torch::empty({gathered.numel()}, host.options());
    communicator.all_gather(std::span<const std::byte>(static_cast<const std::byte*>(host.data_ptr()), host.nbytes()),
                            std::span<std::byte>(static_cast<std::byte*>(all.data_ptr()), all.nbytes()));
    gathered.copy_(all);
  }
}

}  // namespace branchgrpo::detail
