// Writes the checkpoints the `branchgrpo weights` CLI tests read (tests/packaging.cmake), into the folder given
// as the only argument. Zero-filled BF16 tensors with the names and shapes of flux_config::tiny():
//   tiny_bfl.safetensors, tiny_diffusers.safetensors      every tensor of the layout
//   tiny_sharded.safetensors.index.json (+ 2 shards)      the diffusers tensors split over two files
//   missing_shard/tiny_sharded.safetensors.index.json     the same index without its shards
//   tiny_bfl_damaged.safetensors                          img_in.bias missing, extra.weight added,
//                                                         img_in.weight of shape [64, 8] instead of [64, 16]
//   not_flux.safetensors                                  a VAE-like name, no FLUX layout
//   malformed.safetensors                                 img_in.weight's offsets hold 12 bytes, its shape needs 16
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/safetensors.hpp"

namespace {

using namespace branchgrpo;
namespace fs = std::filesystem;

const std::vector<std::byte> zeros(1 << 20);  // shared storage of every tensor's (zero) bytes; the largest
                                              // tiny tensor, single_blocks.N.linear1.weight, takes 57344

safetensors_entry entry(const std::string& name, std::vector<std::int64_t> shape) {
  std::size_t count = 2;  // BF16
  for (std::int64_t extent : shape) count *= static_cast<std::size_t>(extent);
  if (count > zeros.size()) throw std::length_error(name + " is larger than the fixtures' zero buffer");
  return {.name = name, .dtype = safetensors_dtype::bf16, .shape = std::move(shape), .bytes = {zeros.data(), count}};
}

std::vector<safetensors_entry> entries(flux_layout layout) {
  std::vector<safetensors_entry> out;
  for (const flux_tensor_spec& spec : flux_expected_tensors(flux_config::tiny(), layout))
    out.push_back(entry(spec.name, spec.shape));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_weights_fixtures FOLDER\n";
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    const std::map<std::string, std::string> metadata = {{"format", "pt"}};
    write_safetensors(dir / "tiny_bfl.safetensors", entries(flux_layout::bfl), metadata);

    const std::vector<safetensors_entry> diffusers = entries(flux_layout::diffusers);
    write_safetensors(dir / "tiny_diffusers.safetensors", diffusers);
    const std::size_t half = diffusers.size() / 2;
    const std::vector<safetensors_entry> first(diffusers.begin(),
                                               diffusers.begin() + static_cast<std::ptrdiff_t>(half));
    const std::vector<safetensors_entry> second(diffusers.begin() + static_cast<std::ptrdiff_t>(half), diffusers.end());
    write_safetensors(dir / "tiny-00001-of-00002.safetensors", first);
    write_safetensors(dir / "tiny-00002-of-00002.safetensors", second);
    std::ofstream index(dir / "tiny_sharded.safetensors.index.json");
    std::size_t total_size = 0;
    for (const safetensors_entry& e : diffusers) total_size += e.bytes.size();
    index << "{\"metadata\": {\"total_size\": " << total_size << "}, \"weight_map\": {";
    for (std::size_t i = 0; i < diffusers.size(); ++i)
      index << (i ? ", " : "") << '"' << diffusers[i].name << "\": \"tiny-0000" << (i < half ? 1 : 2)
            << "-of-00002.safetensors\"";
    index << "}}\n";
    index.close();
    fs::create_directories(dir / "missing_shard");  // the index without its shards
    fs::copy_file(dir / "tiny_sharded.safetensors.index.json",
                  dir / "missing_shard" / "tiny_sharded.safetensors.index.json", fs::copy_options::overwrite_existing);

    std::vector<safetensors_entry> damaged;
    for (safetensors_entry& e : entries(flux_layout::bfl)) {
      if (e.name == "img_in.bias") continue;
      if (e.name == "img_in.weight") e = entry("img_in.weight", {64, 8});
      damaged.push_back(e);
    }
    damaged.push_back(entry("extra.weight", {1}));
    write_safetensors(dir / "tiny_bfl_damaged.safetensors", damaged);

    write_safetensors(dir / "not_flux.safetensors",
                      std::vector<safetensors_entry>{entry("encoder.conv_in.weight", {4, 3, 3, 3})});

    const std::string header = R"({"img_in.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})";
    std::ofstream malformed(dir / "malformed.safetensors", std::ios::binary);
    std::uint64_t length = header.size();
    for (int i = 0; i < 8; ++i, length >>= 8) malformed.put(static_cast<char>(length & 0xFF));
    malformed << header << std::string(12, '\0');
  } catch (const std::exception& error) {
    std::cerr << "make_weights_fixtures: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
