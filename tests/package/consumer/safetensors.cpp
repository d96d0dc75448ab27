// branchgrpo::safetensors alone, from the installed package (no LibTorch): serializes a 2-tensor file in memory,
// parses it back and checks a value; fails unless the round trip is exact.
#include <branchgrpo/safetensors.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <span>
#include <vector>

int main() {
  const std::array<float, 4> weights = {1.0f, -2.5f, 3.25f, 4.0f};
  const std::array<std::uint8_t, 2> mask = {1, 0};
  const std::vector<branchgrpo::safetensors_entry> entries = {
      {.name = "w",
       .dtype = branchgrpo::safetensors_dtype::f32,
       .shape = {2, 2},
       .bytes = std::as_bytes(std::span(weights))},
      {.name = "m", .dtype = branchgrpo::safetensors_dtype::u8, .shape = {2}, .bytes = std::as_bytes(std::span(mask))}};
  const std::vector<std::byte> file = branchgrpo::serialize_safetensors(entries, {{"format", "pt"}});
  const branchgrpo::safetensors_contents contents = branchgrpo::parse_safetensors(file, "consumer.safetensors");
  // Sorted by name: m, then w.
  if (contents.tensors.size() != 2 || contents.tensors[1].name != "w" || contents.metadata.at("format") != "pt")
    return 1;
  const std::vector<float> values = branchgrpo::safetensors_to_float(contents.tensors[1]);
  std::cout << "safetensors: " << file.size() << " bytes, " << contents.tensors.size()
            << " tensors, w[1] = " << values[1] << '\n';
  return values.size() == 4 && values[1] == -2.5f && contents.tensors[0].numel() == 2 ? 0 : 1;
}
