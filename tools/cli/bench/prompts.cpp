// `branchgrpo bench prompts`: a prompt dataset of --count prompts written in shards, opened memory-mapped
// (open_prompt_dataset) and read by random batches as a run reads them, against the same rows loaded whole into
// memory (what a run did before datasets were mapped). It prints the resident memory each way, measured in the
// same run from /proc/self/status, and the time per batch (docs/prompt_embeddings.md, "Datasets at scale").
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "cli/commands.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/options/number_options.hpp"

namespace branchgrpo::cli {
namespace {

struct prompt_bench_options {
  std::int64_t count = 50'000;
  std::int64_t tokens = 16;
  std::int64_t width = 64;
  std::int64_t pooled = 32;
  std::int64_t shard_rows = 5'000;
  std::int64_t batch = 16;
  std::int64_t batches = 200;
  std::uint64_t seed = 0;
  std::string dir = "out/bench_prompts";
};

// This process's resident memory from /proc/self/status: its own (anonymous) pages, and the file pages it maps
// (the page cache's, shared and reclaimable). Zeros where there is no such file.
struct resident_memory {
  double anonymous = 0;
  double file = 0;
};
resident_memory resident_now() {
  std::ifstream status("/proc/self/status");
  resident_memory out;
  std::string key;
  while (status >> key) {
    double kib = 0;
    if (key == "RssAnon:" && status >> kib) out.anonymous = kib * 1024;
    if (key == "RssFile:" && status >> kib) out.file = kib * 1024;
    std::getline(status, key);
  }
  return out;
}
resident_memory operator-(const resident_memory& a, const resident_memory& b) {
  return {.anonymous = std::max(0.0, a.anonymous - b.anonymous), .file = std::max(0.0, a.file - b.file)};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_prompt_bench(const prompt_bench_options& o) {
  const double row_bytes = static_cast<double>(o.tokens * o.width + o.pooled) * 4;
  const double file_bytes = static_cast<double>(o.count) * row_bytes;
  require_fits(2 * file_bytes, setting_text("--count", o.count), "the dataset and its in-memory copy");
  // --dir is replaced: refuse one that holds anything but an earlier run's shards.
  const std::filesystem::path dir(o.dir);
  if (std::filesystem::exists(dir)) {
    require(std::filesystem::is_directory(dir), "--dir = ", o.dir, ": not a directory");
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      require(entry.is_regular_file() && name.starts_with("p-") && name.ends_with(".safetensors"), "--dir = ", o.dir,
              ": holds ", name, ", which is not a shard of this benchmark (give an empty or new directory)");
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  // The dataset: random rows, written shard by shard (as export_prompt_embeddings.py --shard-rows does).
  auto start = std::chrono::steady_clock::now();
  const std::int64_t shards = (o.count + o.shard_rows - 1) / o.shard_rows;
  torch::manual_seed(o.seed);
  for (std::int64_t k = 0; k < shards; ++k) {
    const std::int64_t first = k * o.shard_rows, rows = std::min(o.shard_rows, o.count - first);
    std::vector<std::string> prompts;
    for (std::int64_t r = 0; r < rows; ++r) prompts.push_back("prompt " + std::to_string(first + r));
    char name[64];
    std::snprintf(name, sizeof name, "p-%05lld-of-%05lld.safetensors", static_cast<long long>(k + 1),
                  static_cast<long long>(shards));
    save_prompt_file(dir / name,
                     prompt_embeddings{.context = torch::randn({rows, o.tokens, o.width}),
                                       .pooled = o.pooled > 0 ? torch::randn({rows, o.pooled}) : torch::Tensor()},
                     prompts);
  }
  const double write_seconds = seconds_since(start);

  // Random batches of rows, the same for both ways.
  std::mt19937_64 random(o.seed);
  std::uniform_int_distribution<std::int64_t> row(0, o.count - 1);
  std::vector<std::vector<std::int64_t>> batches(static_cast<std::size_t>(o.batches));
  for (auto& b : batches)
    for (std::int64_t i = 0; i < o.batch; ++i) b.push_back(row(random));
  const auto read_batches = [&](const prompt_table& table, double& checksum) {
    std::vector<double> seconds;
    for (const auto& b : batches) {
      const auto t = std::chrono::steady_clock::now();
      const prompt_embeddings rows = table.rows(b, torch::kCPU);
      seconds.push_back(seconds_since(t));
      checksum += rows.context.sum().item<double>();
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  };

  // Mapped: the headers and prompt strings only; rows copied out per batch.
  const resident_memory before_open = resident_now();
  start = std::chrono::steady_clock::now();
  double mapped_checksum = 0;
  double mapped_open = 0, mapped_median = 0;
  resident_memory mapped_resident, mapped_opened;
  {
    const prompt_dataset data = open_prompt_dataset(dir);
    mapped_open = seconds_since(start);
    mapped_opened = resident_now() - before_open;
    require(data.rows.size() == o.count, "bench prompts: the dataset holds ", data.rows.size(), " prompts, not ",
            o.count);
    mapped_median = read_batches(data.rows, mapped_checksum);
    mapped_resident = resident_now() - before_open;
  }

  // In memory: every shard loaded whole (float32) and concatenated into one table.
  const resident_memory before_load = resident_now();
  start = std::chrono::steady_clock::now();
  double memory_checksum = 0;
  double memory_load = 0, memory_median = 0;
  resident_memory memory_resident;
  {
    std::vector<torch::Tensor> context, pooled;
    for (const auto& file : branchgrpo::detail::prompt_shards(dir)) {  // the shard names only: nothing mapped
      prompt_file loaded = load_prompt_file(file);
      context.push_back(loaded.embeddings.context);
      if (loaded.embeddings.pooled.defined()) pooled.push_back(loaded.embeddings.pooled);
    }
    const prompt_table table(torch::cat(context), pooled.empty() ? torch::Tensor() : torch::cat(pooled));
    context.clear();
    pooled.clear();
    memory_load = seconds_since(start);
    memory_median = read_batches(table, memory_checksum);
    memory_resident = resident_now() - before_load;
  }
  require(mapped_checksum == memory_checksum, "bench prompts: the mapped rows differ from the rows in memory");

  std::printf(
      "dataset: %lld prompts of %lld x %lld features + %lld pooled (float32) in %lld shards, %s on disk, "
      "written in %.2f s\n",
      static_cast<long long>(o.count), static_cast<long long>(o.tokens), static_cast<long long>(o.width),
      static_cast<long long>(o.pooled), static_cast<long long>(shards), byte_text(file_bytes).c_str(), write_seconds);
  std::printf("%-10s %10s %18s %18s %18s %22s\n", "table", "open (s)", "own after open", "own after reads",
              "file pages", "batch of rows (median)");
  std::printf("%-10s %10.3f %18s %18s %18s %19.3f ms\n", "mapped", mapped_open,
              byte_text(mapped_opened.anonymous).c_str(), byte_text(mapped_resident.anonymous).c_str(),
              byte_text(mapped_resident.file).c_str(), 1e3 * mapped_median);
  std::printf("%-10s %10.3f %18s %18s %18s %19.3f ms\n", "in memory", memory_load, "-",
              byte_text(memory_resident.anonymous).c_str(), byte_text(memory_resident.file).c_str(),
              1e3 * memory_median);
  std::printf("own resident ratio mapped / in memory: %.4f; batch time ratio: %.2f (%lld batches of %lld rows)\n",
              mapped_resident.anonymous / std::max(1.0, memory_resident.anonymous),
              mapped_median / std::max(1e-12, memory_median), static_cast<long long>(o.batches),
              static_cast<long long>(o.batch));
}

}  // namespace

void add_bench_prompts_command(CLI::App& bench) {
  auto options = std::make_shared<prompt_bench_options>();
  CLI::App* prompts = bench.add_subcommand(
      "prompts", "Resident memory and time per batch of a sharded prompt dataset, mapped vs loaded in memory");
  add_integer(prompts, "--count", options->count, "Prompts in the dataset", std::int64_t{1},
              std::int64_t{1'000'000'000})
      ->type_name("N")
      ->capture_default_str();
  add_integer(prompts, "--tokens", options->tokens, "Tokens per prompt (L)", std::int64_t{1}, std::int64_t{4096})
      ->type_name("L")
      ->capture_default_str();
  add_integer(prompts, "--width", options->width, "Token feature width (D)", std::int64_t{1}, std::int64_t{65536})
      ->type_name("D")
      ->capture_default_str();
  add_integer(prompts, "--pooled", options->pooled, "Pooled vector width (0: none)", std::int64_t{0},
              std::int64_t{65536})
      ->type_name("V")
      ->capture_default_str();
  add_integer(prompts, "--shard-rows", options->shard_rows, "Prompts per shard", std::int64_t{1},
              std::int64_t{1'000'000'000})
      ->type_name("R")
      ->capture_default_str();
  add_integer(prompts, "--batch", options->batch, "Rows per batch", std::int64_t{1}, std::int64_t{65536})
      ->type_name("B")
      ->capture_default_str();
  add_integer(prompts, "--batches", options->batches, "Batches read each way", std::int64_t{1}, std::int64_t{1'000'000})
      ->type_name("K")
      ->capture_default_str();
  add_integer(prompts, "--seed", options->seed, "Seed of the rows and the batches")
      ->type_name("S")
      ->capture_default_str();
  prompts->add_option("--dir", options->dir, "Where the shards are written (replaced)")
      ->type_name("DIR")
      ->capture_default_str();
  prompts->callback([options] { run_prompt_bench(*options); });
}

}  // namespace branchgrpo::cli
