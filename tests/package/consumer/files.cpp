// branchgrpo::files alone, from the installed package: writes a small file, reads it back through
// read_input_file and refuses a directory; fails unless both behave.
#include <branchgrpo/files/input_file.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

int main() {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "branchgrpo_files_consumer.txt";
  if (std::FILE* file = std::fopen(path.c_str(), "wb")) {
    std::fputs("abc", file);
    std::fclose(file);
  }
  const std::string text = branchgrpo::read_input_file(path, branchgrpo::input_kinds::config);
  std::filesystem::remove(path);
  std::string refusal;
  try {
    (void)branchgrpo::read_input_file(std::filesystem::temp_directory_path(), branchgrpo::input_kinds::config);
  } catch (const branchgrpo::invalid_input& error) {
    refusal = error.what();
  }
  std::cout << "files: read '" << text << "', refused: " << refusal << '\n';
  return text == "abc" && refusal.ends_with(": is a directory, not a config file") ? 0 : 1;
}
