#pragma once
// The one place for differences between LibTorch 1.13 (Debian's libtorch-dev, the CPU build CI uses) and
// PyTorch 2.x's LibTorch (pip's torch, CPU or CUDA). Everything else in adapters/torch uses API common to both.
// Each switch reads TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR from <torch/version.h>:
//
//   attention(q, k, v)      2.0+: at::scaled_dot_product_attention (fused kernels: flash / memory-efficient on
//                           CUDA). 1.13: softmax(q k^T / sqrt(d)) v written out, softmax in float32 at least.
//   autocast_guard          2.4+: at::autocast::set_autocast_enabled / set_autocast_dtype(device, ...)
//                           (the per-device API; the old names are deprecated there).
//                           1.13 - 2.3: at::autocast::set_enabled / set_autocast_gpu_dtype (CUDA only).
//   allow_tf32(bool)        at::globalContext().setAllowTF32CuBLAS / setAllowTF32CuDNN (every version here).
//   float8_e4m3fn_dtype()   2.1+: at::kFloat8_e4m3fn exists; before, no float8 dtype (std::nullopt): callers
//                           decode F8_E4M3 on the host into a wider dtype.
//
// Also here: LibTorch's logging header (glog in Debian's build, c10's fallback in pip's) defines a CHECK macro
// that would silently replace the CHECK of a test framework included earlier (Catch2's CHECK would then abort
// instead of recording a failure). The includes below keep whatever CHECK meant before them, so our torch
// headers may be included before or after <catch2/catch.hpp>. Every header of the adapter and of the application
// layer reaches LibTorch through this one (torchscript.hpp guards its <torch/script.h> the same way; a file that
// includes <torch/torch.h> itself after Catch2 must do the same or include LibTorch first).
#pragma push_macro("CHECK")
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>
#pragma pop_macro("CHECK")

#include <cmath>
#include <optional>

namespace branchgrpo {

/// True when compiled against LibTorch major.minor or newer.
constexpr bool torch_at_least(int major, int minor) {
  return TORCH_VERSION_MAJOR > major || (TORCH_VERSION_MAJOR == major && TORCH_VERSION_MINOR >= minor);
}

/// Scaled dot-product attention without mask or dropout: softmax(q k^T / sqrt(d)) v.
/// q: [batch, heads, queries, d], k and v: [batch, heads, keys, d] -> [batch, heads, queries, d].
/// Example: q = k = [[1, 0]], v = [[2, 4]] (one key) -> [[2, 4]] (a single key takes all the weight).
/// @pre q, k, v of one dtype and device, 4-D, matching batch/heads/d.
/// @post on 1.13 the softmax runs in float32 for half / bfloat16 inputs and the result has q's dtype; on 2.x
///       the fused kernel's numerics (equal to the written-out form up to rounding).
inline torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v);
#else
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const bool low_precision = q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16;
  const torch::Tensor weights =
      low_precision ? torch::softmax(scores.to(torch::kFloat32), -1).to(q.scalar_type()) : torch::softmax(scores, -1);
  return torch::matmul(weights, v);
#endif
}

/// Scoped default dtype of LibTorch's factory functions (torch::empty, torch::randn, a module's parameters): a
/// model built inside one is created in `dtype` directly, so FLUX.1-dev (12 B parameters) takes 24 GB in bfloat16
/// while it is built instead of 48 GB in float32 before a cast. Restores the previous default on destruction.
class default_dtype_guard {
 public:
  explicit default_dtype_guard(torch::Dtype dtype) : previous_(torch::get_default_dtype()) {
    torch::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
  }
  ~default_dtype_guard() { torch::set_default_dtype(previous_); }
  default_dtype_guard(const default_dtype_guard&) = delete;
  default_dtype_guard& operator=(const default_dtype_guard&) = delete;

 private:
  caffe2::TypeMeta previous_;
};

/// Lets CUDA float32 matrix products (cuBLAS) and convolutions (cuDNN) use TF32 tensor cores, or forbids it:
/// PyTorch's torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 (10 mantissa bits in the
/// products, float32 sums). Process-wide; no effect on CPU work.
inline void allow_tf32(bool allowed) {
  at::globalContext().setAllowTF32CuBLAS(allowed);
  at::globalContext().setAllowTF32CuDNN(allowed);
}

/// Scoped automatic mixed precision on CUDA: while alive, eligible ops on CUDA tensors (matmul, linear,
/// attention) run in `dtype` (bfloat16 by default). A no-op when `enabled` is false or `device` is not CUDA
/// (autocast on CPU is deliberately not used: CPU bf16 matmuls are slow and the CPU tests compare fp32 numbers).
/// Restores the previous state on destruction and clears the cast cache when the outermost guard ends.
class autocast_guard {
 public:
  explicit autocast_guard(bool enabled, torch::Device device, torch::Dtype dtype = torch::kBFloat16)
      : active_(enabled && device.is_cuda()) {
    if (!active_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    previous_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    previous_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
    previous_enabled_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
    at::autocast::increment_nesting();
  }
  ~autocast_guard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, previous_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, previous_dtype_);
#else
    at::autocast::set_enabled(previous_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
#endif
  }
  autocast_guard(const autocast_guard&) = delete;
  autocast_guard& operator=(const autocast_guard&) = delete;

  /// Whether autocast was switched on by this guard (false on CPU).
  [[nodiscard]] bool active() const { return active_; }

 private:
  bool active_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

/// The float8 E4M3 (finite-only, "fn") dtype when this LibTorch has one (2.1+), else std::nullopt.
inline std::optional<torch::Dtype> float8_e4m3fn_dtype() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return at::kFloat8_e4m3fn;
#else
  return std::nullopt;
#endif
}

}  // namespace branchgrpo
