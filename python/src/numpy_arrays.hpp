#pragma once
// Host arrays across the boundary: a numpy array owning a copy of a span, and the values of a 1-D numpy array.
// Example: from_numpy<double>(numpy_copy(std::span{values})) == values.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <span>
#include <vector>

namespace branchgrpo::python {

namespace nb = nanobind;

/// A numpy array owning a copy of `values`.
template <class T>
nb::object numpy_copy(std::span<const T> values) {
  auto* copy = new std::vector<T>(values.begin(), values.end());
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(copy->data(), {copy->size()}, owner));
}

/// The values of a 1-D numpy array (float64, int64 or uint8), copied.
template <class T>
std::vector<T> from_numpy(const nb::handle& array) {
  const auto view = nb::cast<nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(array);
  return std::vector<T>(view.data(), view.data() + view.shape(0));
}

}  // namespace branchgrpo::python
