#pragma once
// What ZeRO-1 and ZeRO-2 (zero1.hpp, zero2.hpp) share: this rank's range of the trainable tensors laid end to end
// (training/sharding.hpp's flat_shard), its float32 masters (one per tensor the range overlaps: what AdamW and the
// EMA hold), and the collectives that put the ranks' masters back together, over the communicator by its type.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/collectives.hpp"
#include "branchgrpo/torch/optim.hpp"
#include "branchgrpo/training/sharding.hpp"

namespace branchgrpo::gradient_modes {

/// One trainable tensor's part of this rank's range: its flat elements [begin, begin + length).
struct shard_piece {
  std::size_t tensor = 0;
  std::int64_t begin = 0, length = 0;
};

/// This rank's shard of the trainable tensors and its float32 masters.
/// Example: 2 ranks, float32 trainable tensors [3] and [2] -> chunk 3; rank 0 holds one master [3] (all of tensor
///   0, in its shape), rank 1 one master [2] (all of tensor 1); gather_pieces({m}) on both -> {[3], [2]}.
/// @pre the trainable tensors live on one device and have one master dtype (float32 for 16-bit and float32 tensors;
///      else invalid_input); `communicator` outlives the shard, and every rank calls its collectives in one order.
template <Communicator C>
class sharded_masters {
 public:
  sharded_masters(std::vector<torch::Tensor> parameters, C& communicator)
      : communicator_(&communicator), parameters_(std::move(parameters)) {
    torch::NoGradGuard no_grad;
    master_dtype_ = master_dtype_of(parameters_.front());
    std::int64_t total = 0;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const torch::ScalarType dtype = master_dtype_of(parameters_[i]);
      require(dtype == master_dtype_, "sharding needs one master dtype: trainable tensor ", i, " has ", dtype,
              ", tensor 0 ", master_dtype_);
      require(parameters_[i].device() == parameters_.front().device(), "sharding needs one device: trainable tensor ",
              i, " is on ", parameters_[i].device(), ", tensor 0 on ", parameters_.front().device());
      offsets_.push_back(total);
      total += parameters_[i].numel();
    }
    shard_ = flat_shard::of(total, communicator.rank(), communicator.size());
    make_pieces();
  }

  [[nodiscard]] C& communicator() const { return *communicator_; }
  /// This rank's range of the flat buffer of trainable tensors.
  [[nodiscard]] const flat_shard& shard() const { return shard_; }
  /// The float32 masters of the pieces (what AdamW steps), in the pieces' shapes.
  [[nodiscard]] const std::vector<torch::Tensor>& masters() const { return masters_; }
  /// The model's trainable tensors (their dtype).
  [[nodiscard]] const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  [[nodiscard]] const std::vector<shard_piece>& pieces() const { return pieces_; }
  /// Each trainable tensor's first element in the flat buffer.
  [[nodiscard]] const std::vector<std::int64_t>& offsets() const { return offsets_; }
  [[nodiscard]] torch::ScalarType master_dtype() const { return master_dtype_; }
  /// The masters' dtype on the tensors' device.
  [[nodiscard]] torch::TensorOptions options() const {
    return torch::TensorOptions().dtype(master_dtype_).device(parameters_.front().device());
  }

  static torch::Tensor piece_of(const torch::Tensor& tensor, const shard_piece& piece) {
    return tensor.detach().reshape({-1}).narrow(0, piece.begin, piece.length);
  }

  /// A DataParallelPolicy's all_reduce_gradients goes over the group the shard was built for.
  /// @pre rank and size are the shard's (else invalid_input).
  void check_group(int rank, int size) const {
    require(rank == shard_.rank && size == shard_.size, "all_reduce_gradients as rank ", rank, " of ", size,
            ", but the sharded policy was built for rank ", shard_.rank, " of ", shard_.size);
  }

  /// The global gradient norm: the square root of the masters' squared norms summed over the ranks.
  double global_norm() {
    double squares = gradient_squares(masters_);
    if (shard_.size > 1) communicator_->all_reduce_sum(std::span<double>(&squares, 1));
    return std::sqrt(squares);
  }
  /// The masters' gradients (ZeRO-2: views of the update's sums) are released, not kept as zeros.
  void release_gradients() {
    for (torch::Tensor& piece : masters_) piece.mutable_grad() = torch::Tensor();
  }

  /// Every rank's masters, all-gathered (padded to equal chunks), into the model's tensors (rounded to their dtype).
  void gather_into_model() {
    torch::NoGradGuard no_grad;
    const torch::Tensor gathered = gathered_flat(masters_);
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      parameters_[i].detach().copy_(
          gathered.narrow(0, offsets_[i], parameters_[i].numel()).view(parameters_[i].sizes()));
  }

  /// Full tensors, one per trainable tensor in its shape and the master dtype, from tensors aligned with masters()
  /// on every rank. A collective.
  std::vector<torch::Tensor> gather_pieces(std::span<const torch::Tensor> per_piece) {
    const torch::Tensor gathered = gathered_flat(per_piece);
    std::vector<torch::Tensor> full;
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      full.push_back(gathered.narrow(0, offsets_[i], parameters_[i].numel()).view(parameters_[i].sizes()).clone());
    return full;
  }

  /// This rank's pieces of full tensors (one per trainable tensor), shaped as masters(). No collective.
  /// @pre one tensor per trainable tensor, of its element count (else invalid_input naming the index).
  [[nodiscard]] std::vector<torch::Tensor> pieces_of(std::span<const torch::Tensor> full) const {
    require(full.size() == parameters_.size(), "pieces_of got ", full.size(), " tensors for ", parameters_.size(),
            " trainable");
    std::vector<torch::Tensor> out;
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      const std::size_t i = pieces_[k].tensor;
      require(full[i].numel() == parameters_[i].numel(), "pieces_of: tensor ", i, " has ", full[i].numel(),
              " elements, the trainable tensor ", parameters_[i].numel());
      out.push_back(piece_of(full[i], pieces_[k]).to(options()).view_as(masters_[k]).clone());
    }
    return out;
  }

  /// Sets the masters to `pieces`, then all-gathers them into the model's tensors. A collective.
  /// @pre one tensor per master, of its element count (else invalid_input naming the piece).
  void load_pieces(std::span<const torch::Tensor> pieces) {
    require(pieces.size() == masters_.size(), "load_shard_masters got ", pieces.size(), " tensors for ",
            masters_.size(), " pieces of the shard");
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      require(pieces[k].numel() == masters_[k].numel(), "load_shard_masters: piece ", k, " has ", pieces[k].numel(),
              " elements, the shard's ", masters_[k].numel());
      masters_[k].copy_(pieces[k].reshape(masters_[k].sizes()));
    }
    gather_into_model();
  }

  /// Sets the model's tensors and this rank's masters to `values` (full tensors, in order). No collective.
  /// @pre values checked by the caller (one per trainable tensor, in its shape).
  void load(std::span<const torch::Tensor> values) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parameters_.size(); ++i) parameters_[i].copy_(values[i]);
    for (std::size_t k = 0; k < pieces_.size(); ++k)
      masters_[k].copy_(piece_of(values[pieces_[k].tensor], pieces_[k]).view_as(masters_[k]));
  }

  /// The sum of `value` over the ranks (a collective with several).
  double sum_over_ranks(double value) {
    if (shard_.size > 1) communicator_->all_reduce_sum(std::span<double>(&value, 1));
    return value;
  }

 private:
  static torch::ScalarType master_dtype_of(const torch::Tensor& t) {
    const bool is_16_bit = t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
    return is_16_bit ? torch::kFloat32 : t.scalar_type();
  }

  // This rank's float32 pieces. A piece that is a whole tensor keeps the tensor's shape (with one rank every piece
  // does: AdamW then sees the unsharded tensors).
  void make_pieces() {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const std::int64_t first = std::max(shard_.lo, offsets_[i]);
      const std::int64_t last = std::min(shard_.hi, offsets_[i] + parameters_[i].numel());
      if (first >= last) continue;
      const shard_piece piece{.tensor = i, .begin = first - offsets_[i], .length = last - first};
      torch::Tensor master = piece_of(parameters_[i], piece).to(master_dtype_).clone();
      if (piece.length == parameters_[i].numel()) master = master.view(parameters_[i].sizes());
      master.set_requires_grad(true);
      pieces_.push_back(piece);
      masters_.push_back(master);
    }
  }

  // The flat buffer of per-piece tensors (aligned with pieces_) from every rank: each rank's chunk padded with zeros
  // to the same length, all-gathered; with one rank, this rank's chunk.
  torch::Tensor gathered_flat(std::span<const torch::Tensor> per_piece) {
    require(per_piece.size() == pieces_.size(), "gathering ", per_piece.size(), " tensors for ", pieces_.size(),
            " pieces of the shard");
    torch::NoGradGuard no_grad;
    torch::Tensor local = torch::zeros({shard_.chunk}, options());
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      local.narrow(0, at, pieces_[k].length).copy_(per_piece[k].detach().reshape({-1}));
      at += pieces_[k].length;
    }
    if (shard_.size == 1) return local;
    torch::Tensor gathered = torch::empty({shard_.padded()}, options());
    detail::all_gather_tensor(*communicator_, local, gathered);
    return gathered;
  }

  C* communicator_;
  std::vector<torch::Tensor> parameters_;
  flat_shard shard_;
  std::vector<std::int64_t> offsets_;
  std::vector<shard_piece> pieces_;
  std::vector<torch::Tensor> masters_;
  torch::ScalarType master_dtype_ = torch::kFloat32;
};

}  // namespace branchgrpo::gradient_modes
