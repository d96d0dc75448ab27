#pragma once
// The group a training run's policy is built for. training_run (training_run.hpp) is one class whatever
// communicator drives it (single_process, c10d_communicator), so its policy is autograd_policy<model, run_group>,
// and run_group forwards each collective to the run's communicator by its type: the run's one type-erased point;
// the policy and its gradient modes (branchgrpo/torch/gradient_modes/) see one concrete communicator type.
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/collectives.hpp"

namespace branchgrpo {

/// A Communicator that is another one, of any type, with that one's tensor collectives where it has them (on the
/// tensors' device for c10d_communicator), else the host paths of gradient_modes/collectives.hpp.
/// Example: single_process one; run_group group(one); -> group.rank() == 0, group.size() == 1, and
///   group.all_reduce_sum(tensors) leaves the tensors as they are.
/// @pre the communicator outlives the group; its rank and size do not change.
class run_group {
 public:
  template <Communicator C>
  requires(!std::is_same_v<C, run_group>) explicit run_group(C& communicator)
      : communicator_(&communicator),
        rank_(communicator.rank()),
        size_(communicator.size()),
        operations_(&operations_of<C>) {}

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  void all_reduce_sum(std::span<double> values) { operations_->values(communicator_, values); }
  void all_reduce_sum(std::vector<torch::Tensor>& tensors) { operations_->tensors(communicator_, tensors); }
  void reduce_sum_to(torch::Tensor& tensor, int root) { operations_->reduce_to(communicator_, tensor, root); }
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) {
    operations_->bytes(communicator_, local, gathered);
  }
  void all_gather(const torch::Tensor& local, torch::Tensor& gathered) {
    operations_->gather(communicator_, local, gathered);
  }
  void barrier() { operations_->barrier(communicator_); }

 private:
  struct operations {
    void (*values)(void*, std::span<double>);
    void (*tensors)(void*, std::vector<torch::Tensor>&);
    void (*reduce_to)(void*, torch::Tensor&, int);
    void (*bytes)(void*, std::span<const std::byte>, std::span<std::byte>);
    void (*gather)(void*, const torch::Tensor&, torch::Tensor&);
    void (*barrier)(void*);
  };
  template <Communicator C>
  static C& of(void* communicator) {
    return *static_cast<C*>(communicator);
  }
  template <Communicator C>
  static constexpr operations operations_of{
      .values = [](void* c, std::span<double> values) { of<C>(c).all_reduce_sum(values); },
      .tensors = [](void* c, std::vector<torch::Tensor>& tensors) { detail::all_reduce_tensors(of<C>(c), tensors); },
      .reduce_to = [](void* c, torch::Tensor& tensor, int root) { detail::reduce_tensor_to(of<C>(c), tensor, root); },
      .bytes = [](void* c, std::span<const std::byte> local,
                  std::span<std::byte> gathered) { of<C>(c).all_gather(local, gathered); },
      .gather = [](void* c, const torch::Tensor& local,
                   torch::Tensor& gathered) { detail::all_gather_tensor(of<C>(c), local, gathered); },
      .barrier = [](void* c) { of<C>(c).barrier(); },
  };

  void* communicator_;
  int rank_, size_;
  const operations* operations_;
};

static_assert(Communicator<run_group>, "run_group must model Communicator (distributed/communicator.hpp)");

}  // namespace branchgrpo
