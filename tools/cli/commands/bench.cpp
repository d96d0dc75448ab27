#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/toy.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "cli/bench/harness.hpp"
#include "cli/commands.hpp"
#include "cli/options/number_options.hpp"
#ifdef BRANCHGRPO_CLI_BENCH_FLUX  // built with LibTorch, TurboJPEG and toml++ only (tools/CMakeLists.txt)
#include "cli/bench/flux.hpp"
#include "cli/bench/sd3.hpp"
#include "cli/bench/wan.hpp"
#include "cli/bench/wan22.hpp"
#endif

namespace branchgrpo::cli {
namespace {

static_assert(Policy<timed_policy<host_backend, fourier_policy<host_backend>>, host_backend>);
static_assert(Reward<timed_reward<host_backend, mode_reward<>>, host_backend>);

#ifdef BRANCHGRPO_CLI_BENCH_FLUX
// Each model family's bench (model_spec::bench_models names its --model values): one entry per family of
// model_spec_table, checked below.
struct family_bench {
  std::string_view family;
  void (*run)(const bench_options&);
};
constexpr std::array family_benches = {family_bench{.family = "flux", .run = run_flux_iteration_bench},
                                       family_bench{.family = "wan", .run = run_wan_iteration_bench},
                                       family_bench{.family = "sd3", .run = run_sd3_iteration_bench},
                                       family_bench{.family = "wan22", .run = run_wan22_iteration_bench}};
static_assert(
    family_benches.size() == model_spec_table.size() &&
        [] {
          for (std::size_t i = 0; i < family_benches.size(); ++i)
            if (family_benches[i].family != model_spec_table[i].name) return false;
          return true;
        }(),
    "every model family of model_spec_table needs its bench, in the table's order");
#endif

void run_iteration_bench(const bench_options& options) {
  // Models: the toy on the host backend here; each model family's --model values (model_spec::bench_models:
  // flux-tiny and flux in bench/flux.cpp, wan-tiny, wan, wan22-tiny and wan22 in bench/wan.cpp, sd3-tiny and sd3 in
  // bench/sd3.cpp) on LibTorch.
  std::vector<std::string_view> models = {"toy"};
  for (std::size_t i = 0; i < model_spec_table.size(); ++i) {
    const std::span<const std::string_view> names = model_spec_table[i].bench_models;
    models.insert(models.end(), names.begin(), names.end());
    if (std::ranges::find(names, options.model) == names.end()) continue;
#ifdef BRANCHGRPO_CLI_BENCH_FLUX
    family_benches[i].run(options);
    return;
#else
    fail("model ", options.model, " needs the LibTorch adapter (not built)");
#endif
  }
  require(options.model == "toy", "unknown model '", options.model, "' (expected ", name_list(models), ")");
  validate_bench_options(options, toy_bytes_per_node);
  const fourier_policy<host_backend> base = make_toy_policy(options.seed);
  // Each variant trains its own copy of the toy; prompts cycle through its 8 modes, as `branchgrpo toy` does.
  const std::vector<variant_run> runs = run_harness<host_backend>(
      options, [&](std::size_t) { return base; }, mode_reward<>{}, toy_latent_shape(), 8);
  report_runs(runs, options);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of the training loop (docs/performance.md)");
  bench->require_subcommand(1);
  auto options = std::make_shared<bench_options>();
  CLI::App* iteration = bench->add_subcommand(
      "iteration", "Seconds per iteration of dance and the BranchGRPO variants, run alternately on one model");
  iteration
      ->add_option("--model", options->model,
                   "toy; flux-tiny (the shipped shapes model), flux (random weights of --flux-config), wan-tiny and "
                   "wan (random Wan2.1 transformers, tiny and 1.3B) need the LibTorch adapter")
      ->type_name("NAME")
      ->capture_default_str();
  // Hard limits: iteration counts stay below the noise key's iteration field (with --warmup: validate_bench_options),
  // --steps is the core's max_steps, sizes are checked against memory; the rest are far beyond any sensible run.
  add_integer(iteration, "--iters", options->iters, "Measured iterations per variant", 1, 500'000)
      ->type_name("N")
      ->capture_default_str();
  add_integer(iteration, "--warmup", options->warmup, "Unmeasured iterations per variant first", 0, 500'000)
      ->type_name("N")
      ->capture_default_str();
  add_integer(iteration, "--prompts", options->prompts, "Trees (prompts) per iteration", 1,
              std::numeric_limits<int>::max())
      ->type_name("P")
      ->capture_default_str();
  add_integer(iteration, "--max-batch", options->max_batch, "Rows per model call in training", std::int64_t{1},
              std::numeric_limits<std::int64_t>::max())
      ->type_name("B")
      ->capture_default_str();
  add_integer(iteration, "--steps", options->steps, "Denoising steps", 1, max_steps)
      ->type_name("N")
      ->capture_default_str();
  add_integer(iteration, "--batching-repeats", options->batching_repeats,
              "Rollouts per setting for the batching speedup (median)", 1, 10'000)
      ->type_name("R")
      ->capture_default_str();
  add_integer(iteration, "--seed", options->seed, "Seed of the model and the rollout noise")
      ->type_name("S")
      ->capture_default_str();
  add_text_list(iteration, "--methods", options->methods,
                "Comma-separated subset of dance, branch, branch-widpru, branch-deppru, branch-mix, "
                "branch-mix-flash (default: the first five; must include dance)")
      ->type_name("LIST");
  iteration->add_flag("--json", options->json, "One JSON object keyed by variant");
  iteration->add_option("--json-file", options->json_file, "Also write the JSON object to this file")
      ->type_name("FILE");
  // FLUX models (bench/flux.cpp).
  iteration->add_option("--model-dir", options->model_dir, "flux-tiny: model directory (default models/shapes-tiny)")
      ->type_name("DIR");
  iteration->add_option("--flux-config", options->flux_config, "flux: dev, schnell or tiny (random weights)")
      ->type_name("NAME")
      ->capture_default_str();
  iteration->add_option("--device", options->device, "flux and wan models: cpu, cuda, cuda:N")
      ->type_name("DEV")
      ->capture_default_str();
  iteration->add_option("--dtype", options->dtype, "flux and wan models: weights in float32 or bfloat16")
      ->type_name("T")
      ->capture_default_str();
  add_integer_list(iteration, "--latent", options->latent,
                   "flux: latent C,H,W (default: C of the config, pixels / 8); wan models: C,F,H,W (default wan-tiny "
                   "16,4,8,8, wan 16,5,30,52)",
                   std::int64_t{1}, std::int64_t{4096})
      ->type_name("C,[F,]H,W");
  add_integer(iteration, "--height", options->height, "flux: image height in pixels (latent H = height / 8)",
              std::int64_t{8}, std::int64_t{32768})
      ->type_name("PX")
      ->capture_default_str();
  add_integer(iteration, "--width", options->width, "flux: image width in pixels (latent W = width / 8)",
              std::int64_t{8}, std::int64_t{32768})
      ->type_name("PX")
      ->capture_default_str();
  add_integer(iteration, "--text-tokens", options->text_tokens, "flux: text tokens per prompt (random embeddings)",
              std::int64_t{1}, std::int64_t{65536})
      ->type_name("L")
      ->capture_default_str();
  add_integer(iteration, "--rank", options->lora_rank, "flux and wan models: LoRA rank (attention and MLP layers)",
              std::int64_t{1}, std::int64_t{4096})
      ->type_name("R")
      ->capture_default_str();
  iteration->add_flag("--gradient-checkpointing", options->gradient_checkpointing,
                      "flux and wan models: recompute each block in the backward (less memory)");
  add_number(iteration, "--peak-tflops", options->peak_tflops,
             "flux and wan models: the device's dense bf16 peak, for the fraction reached (H100 / H200: 989)", 1e-3,
             1e6)
      ->type_name("TF")
      ->capture_default_str();
  iteration->callback([options] { run_iteration_bench(*options); });
#ifdef BRANCHGRPO_CLI_BENCH_FLUX
  add_bench_prompts_command(*bench);
#endif
}

}  // namespace branchgrpo::cli
