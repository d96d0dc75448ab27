#pragma once
// Safetensors <-> torch::Tensor. Reading and validation are <branchgrpo/safetensors.hpp>'s (memory-mapped, every
// malformed file rejected with one line naming the file and the tensor); this header only copies the mapped
// bytes into tensors (optionally converting floating-point ones to one dtype and moving them to a device, refusing
// dtypes a model cannot use and NaN or infinite elements) and hands contiguous CPU bytes to the atomic writer.
//
//   load_safetensors(path, {.dtype = torch::kFloat32, .device = torch::kCUDA})  a file or a *.index.json
//   load_safetensors(path, {.allowed_dtypes = model_weight_dtypes, .finite = true})  a model's weights
//   save_safetensors(path, {{"name", tensor}, ...}, {{"format", "pt"}})
//
// F8_E4M3 is decoded exactly on the host into float32 (then the requested dtype) on every LibTorch version, so
// loads behave the same on 1.13 (no float8 dtype) and 2.x; a float8_e4m3fn tensor (LibTorch 2.1+) saves as
// F8_E4M3.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors.hpp"
#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo {

/// Where and as what tensors are loaded. `dtype` applies to floating-point tensors only (integer and bool
/// tensors keep their type); nullopt keeps the file's (float32 for F8_E4M3).
struct safetensors_load_options {
  std::optional<torch::Dtype> dtype = std::nullopt;
  torch::Device device = torch::kCPU;
  /// The dtypes the file may hold; empty: any. A model's weights give model_weight_dtypes: integer weights would
  /// load, train with a zero gradient and mean nothing.
  std::span<const safetensors_dtype> allowed_dtypes = {};
  /// Refuse a NaN or infinite element, tested as the bytes are copied out of the mapping (no second pass).
  bool finite = false;
};

/// The dtypes a FLUX or Wan model's weights (transformer or autoencoder) may have in a file: the floating-point
/// ones their checkpoints come in and the loaders convert to the model's dtype. FLUX.1-dev and schnell are BF16,
/// their autoencoder F32, their fp8 repacks F8_E4M3 (decoded exactly); Wan2.1-1.3B is F32, 14B BF16, with F16 and
/// F8_E4M3 repacks; `branchgrpo pretrain` writes F32. The two families' lists are the same, so this is one list;
/// F64 is not among them (no checkpoint uses it, and float32 would round it).
inline constexpr std::array<safetensors_dtype, 4> model_weight_dtypes = {
    safetensors_dtype::f32, safetensors_dtype::bf16, safetensors_dtype::f16, safetensors_dtype::f8_e4m3};

/// The torch dtype of a safetensors dtype; nullopt for F8_E4M3 (decoded to float32 instead).
inline std::optional<torch::Dtype> torch_dtype_of(safetensors_dtype dtype) {
  switch (dtype) {
    case safetensors_dtype::f64:
      return torch::kFloat64;
    case safetensors_dtype::f32:
      return torch::kFloat32;
    case safetensors_dtype::f16:
      return torch::kFloat16;
    case safetensors_dtype::bf16:
      return torch::kBFloat16;
    case safetensors_dtype::f8_e4m3:
      return std::nullopt;
    case safetensors_dtype::i64:
      return torch::kInt64;
    case safetensors_dtype::i32:
      return torch::kInt32;
    case safetensors_dtype::i16:
      return torch::kInt16;
    case safetensors_dtype::i8:
      return torch::kInt8;
    case safetensors_dtype::u8:
      return torch::kUInt8;
    case safetensors_dtype::boolean:
      return torch::kBool;
  }
  return std::nullopt;
}

/// The safetensors dtype of a torch dtype, or nullopt when the format has none (complex, quantized, ...).
/// Example: torch::kBFloat16 -> bf16; torch::kComplexFloat -> nullopt.
inline std::optional<safetensors_dtype> safetensors_dtype_of(torch::Dtype dtype) {
  for (safetensors_dtype candidate : safetensors_dtypes)
    if (torch_dtype_of(candidate) == dtype) return candidate;
  if (float8_e4m3fn_dtype() == dtype) return safetensors_dtype::f8_e4m3;
  return std::nullopt;
}

namespace detail {

// "<source>: " or nothing: the prefix that names the file in to_torch's messages.
inline std::string source_prefix(std::string_view source) {
  return source.empty() ? std::string() : std::string(source) + ": ";
}

// Throws naming the file, the tensor and its dtype unless `options` allows the dtype.
inline void check_load_dtype(const safetensors_tensor& tensor, const safetensors_load_options& options,
                             std::string_view source) {
  const auto& allowed = options.allowed_dtypes;
  if (allowed.empty() || std::find(allowed.begin(), allowed.end(), tensor.dtype) != allowed.end()) return;
  std::string names;
  for (std::size_t i = 0; i < allowed.size(); ++i)
    names += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + std::string(safetensors_dtype_name(allowed[i]));
  fail(source_prefix(source), "tensor ", safetensors_detail::quote_name(tensor.name), " is ",
       safetensors_dtype_name(tensor.dtype), ": model weights must be ", names);
}

}  // namespace detail

/// A tensor of its own (copied out of the mapping) holding `tensor`'s values, converted and moved per `options`;
/// `source` (the file) starts the messages of the dtype and finiteness checks.
/// Example: BF16 [2] = {1, -3.140625} with .dtype = torch::kFloat32 -> a float32 tensor {1.0, -3.140625};
///   F32 {0, NaN} with .finite = true, source "m.safetensors" -> throws
///   "m.safetensors: tensor 'w' holds a non-finite value (nan) at element 1".
/// @pre options.dtype, when given, is a floating-point dtype.
inline torch::Tensor to_torch(const safetensors_tensor& tensor, const safetensors_load_options& options = {},
                              std::string_view source = {}) {
  require(!options.dtype || c10::isFloatingType(*options.dtype), "tensor ", safetensors_detail::quote_name(tensor.name),
          ": the load dtype must be a floating-point type, got ", c10::toString(*options.dtype));
  detail::check_load_dtype(tensor, options, source);
  std::optional<safetensors_non_finite> non_finite;
  torch::Tensor host;
  if (tensor.dtype == safetensors_dtype::f8_e4m3) {
    if (options.finite) non_finite = safetensors_find_non_finite(tensor.dtype, tensor.data);  // 1 byte an element
    host = torch::empty(tensor.shape, torch::kFloat32);
    safetensors_to_float(tensor, std::span<float>(host.data_ptr<float>(), static_cast<std::size_t>(host.numel())));
  } else if (tensor.dtype == safetensors_dtype::boolean) {
    host = torch::empty(tensor.shape, torch::kUInt8);  // any non-zero byte is true; torch's bool must be 0 or 1
    if (!tensor.data.empty()) std::memcpy(host.data_ptr(), tensor.data.data(), tensor.data.size());
    host = host.ne(0);
  } else {
    host = torch::empty(tensor.shape, *torch_dtype_of(tensor.dtype));
    const std::span<std::byte> out(static_cast<std::byte*>(host.data_ptr()), tensor.data.size());
    if (options.finite)
      non_finite = safetensors_copy_checking_finite(tensor, out);
    else if (!tensor.data.empty())
      std::memcpy(out.data(), tensor.data.data(), tensor.data.size());
  }
  if (non_finite) {
    const float value = non_finite->value;
    fail(detail::source_prefix(source), "tensor ", safetensors_detail::quote_name(tensor.name),
         " holds a non-finite value (", std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf"), ") at element ",
         non_finite->index);
  }
  const torch::Dtype target = options.dtype && host.is_floating_point() ? *options.dtype : host.scalar_type();
  if (target == host.scalar_type() && options.device == host.device()) return host;
  return host.to(options.device, target);
}

/// The file of `checkpoint` that holds `tensor`: its shard when sharded, for messages.
inline std::string safetensors_source(const safetensors_checkpoint& checkpoint, const safetensors_tensor& tensor) {
  if (checkpoint.sharded())
    for (const safetensors_file& shard : checkpoint.files())
      if (shard.find(tensor.name) != nullptr) return shard.path().string();
  return checkpoint.path().string();
}

/// Every tensor of an opened checkpoint, by name (see to_torch; messages name the file, or the shard, holding the
/// tensor). Every tensor's dtype is checked against options.allowed_dtypes before any is copied, so a refused
/// file costs no copy of its other tensors.
inline std::map<std::string, torch::Tensor> load_safetensors(const safetensors_checkpoint& checkpoint,
                                                             const safetensors_load_options& options = {}) {
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    detail::check_load_dtype(tensor, options, safetensors_source(checkpoint, tensor));
  std::map<std::string, torch::Tensor> out;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    out.emplace(tensor.name, to_torch(tensor, options, safetensors_source(checkpoint, tensor)));
  return out;
}

/// Every tensor of a `.safetensors` file or of a sharded checkpoint's `*.index.json`, by name.
/// Example: load_safetensors("flux1-dev.safetensors", {.dtype = torch::kFloat32}) -> 780 float32 tensors.
inline std::map<std::string, torch::Tensor> load_safetensors(const std::filesystem::path& path,
                                                             const safetensors_load_options& options = {}) {
  return load_safetensors(safetensors_checkpoint(path), options);
}

/// Writes `tensors` (any device, any strides; copied to contiguous CPU memory first) and `metadata` to `path`
/// atomically (write_safetensors). Throws invalid_input naming the path and the tensor for an undefined or
/// sparse tensor or a dtype the format lacks.
/// Example: {"w": float32 [2, 2]} -> an 88-byte file: the length 64, the 57-byte header
/// {"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}} and 7 spaces, then the 16 data bytes.
inline void save_safetensors(const std::filesystem::path& path, const std::map<std::string, torch::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  std::vector<torch::Tensor> hosts;  // keep the contiguous copies alive until written
  std::vector<safetensors_entry> entries;
  hosts.reserve(tensors.size());
  entries.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const std::string where = path.string() + ": tensor " + safetensors_detail::quote_name(name) + ": ";
    require(tensor.defined(), where, "undefined tensor");
    require(tensor.layout() == torch::kStrided, where, "only dense (strided) tensors can be saved");
    const std::optional<safetensors_dtype> dtype = safetensors_dtype_of(tensor.scalar_type());
    require(dtype.has_value(), where, "dtype ", c10::toString(tensor.scalar_type()), " has no safetensors equivalent");
    hosts.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& host = hosts.back();
    entries.push_back({.name = name,
                       .dtype = *dtype,
                       .shape = host.sizes().vec(),
                       .bytes = {static_cast<const std::byte*>(host.data_ptr()), host.nbytes()}});
  }
  write_safetensors(path, entries, metadata);
}

}  // namespace branchgrpo
