// The translation unit of branchgrpo_torch_pch (cmake/precompiled_torch.cmake): the precompiled <torch/torch.h>
// that the LibTorch translation units reuse is made while compiling it. It defines nothing.
