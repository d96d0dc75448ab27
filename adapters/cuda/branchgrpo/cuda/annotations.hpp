#pragma once
// The one portability shim of the CUDA adapter. BRANCHGRPO_HOST_DEVICE marks the per-element functions of
// elementwise.hpp __host__ __device__ when nvcc compiles them (kernels.cu) and expands to nothing under a plain C++
// compiler, so the CPU tests (g++, tests/cuda) call the very functions the kernels run. No CUDA header is needed
// for either. The core's arithmetic (noise/box_muller.hpp) needs no annotation: it is constexpr, which nvcc
// compiles for the device under --expt-relaxed-constexpr; Random123 marks its own functions for the device pass.
#if defined(__CUDACC__)
#define BRANCHGRPO_HOST_DEVICE __host__ __device__
#else
#define BRANCHGRPO_HOST_DEVICE
#endif
