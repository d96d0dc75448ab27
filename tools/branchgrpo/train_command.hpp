#pragma once
// `branchgrpo train --config FILE.toml [--resume]` and `branchgrpo sample --config FILE.toml --checkpoint DIR`:
// align a FLUX-architecture model with the run a TOML file describes (docs/config.md), and render samples of a
// checkpoint. Built only with LibTorch, toml++ and TurboJPEG (tools/CMakeLists.txt: BRANCHGRPO_CLI_TRAIN).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers `train`. It prints one line per iteration (JSON lines with --json), shows a progress bar on a
/// terminal, and writes into run.output_dir: metrics.jsonl and metrics.csv, config.toml (a copy of the config),
/// grids/iter-NNNNNN.png (the iteration's leaf images, every run.grid_every iterations and at the end) and
/// checkpoints/iter-NNNNNN/ (every run.checkpoint_every iterations and at the end; checkpoint.hpp).
/// --resume continues from the latest checkpoint; without it an output directory holding checkpoints is refused.
/// Example: `branchgrpo train --config examples/shapes_branch.toml` -> 40 iterations, out/shapes_branch/...
void add_train_command(CLI::App& app);

/// Registers `sample`: the checkpoint's weights, deterministic ODE samples of the given prompts (default: every
/// prompt of the table), a PNG grid (one row per prompt) and each row's mean reward.
/// Example: `branchgrpo sample --config run.toml --checkpoint out/run/checkpoints/iter-000040 --prompts
///   "a red circle,a blue square" --out grid.png`.
void add_sample_command(CLI::App& app);

}  // namespace branchgrpo::cli
