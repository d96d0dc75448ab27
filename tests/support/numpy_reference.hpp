#pragma once
// Runs one of the independent numpy references (tests/reference/*.py) on tensors from a LibTorch test, in the
// exchange format of tests/reference/reference_io.py: config.txt, manifest.txt + one float32 file per tensor in,
// out.bin (float64) back.
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "source_tree.hpp"

namespace branchgrpo::testing {

/// Writes `config_text` and `tensors` into a fresh temporary directory named after `tag`, runs
/// `python3 tests/reference/<script> DIR`, and returns its out.bin as a float64 tensor of `shape`.
/// Throws std::runtime_error when the script fails or writes fewer values than `shape` holds.
inline torch::Tensor run_numpy_reference(const std::string& script, const std::string& tag,
                                         const std::string& config_text,
                                         const std::map<std::string, torch::Tensor>& tensors,
                                         const std::vector<std::int64_t>& shape) {
  const auto dir = std::filesystem::temp_directory_path() / ("branchgrpo_reference_" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.txt") << config_text;
  {
    std::ofstream manifest(dir / "manifest.txt");
    int index = 0;
    for (const auto& [name, tensor] : tensors) {
      const std::string file = std::to_string(index++) + ".bin";
      const torch::Tensor data = tensor.to(torch::kFloat32).contiguous();
      std::ofstream out(dir / file, std::ios::binary);
      out.write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(data.numel() * 4));
      manifest << name << " " << file << " " << data.dim();
      for (auto d : data.sizes()) manifest << " " << d;
      manifest << "\n";
    }
  }
  const auto path = source_root() / "tests" / "reference" / script;
  const std::string command = "python3 -B " + path.string() + " " + dir.string();  // -B: no __pycache__ in the tree
  if (std::system(command.c_str()) != 0) throw std::runtime_error("'" + command + "' failed");
  std::int64_t count = 1;
  for (auto d : shape) count *= d;
  std::vector<double> values(static_cast<std::size_t>(count));
  std::ifstream result(dir / "out.bin", std::ios::binary);
  result.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * 8));
  if (result.gcount() != static_cast<std::streamsize>(values.size() * 8))
    throw std::runtime_error(script + " wrote " + std::to_string(result.gcount() / 8) + " values, expected " +
                             std::to_string(count));
  std::filesystem::remove_all(dir);
  return torch::tensor(values, torch::kFloat64).reshape(shape);
}

}  // namespace branchgrpo::testing
