#pragma once
// `branchgrpo demo [--out DIR] [--quick] [--iters N]`: the README's main command. Aligns the shipped shapes model
// (models/shapes-tiny) with DanceGRPO and the four BranchGRPO variants for the same number of iterations from the
// same seed, with LoRA, and writes a report. Built only with LibTorch, toml++ and TurboJPEG (BRANCHGRPO_CLI_TRAIN).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers `demo`. It writes DIR/report.md (per method: held-out reward before and after, gain, denoiser
/// evaluations, edges, seconds per iteration and the ratio to dance), DIR/reward_vs_time.png (held-out reward
/// against cumulative training time), DIR/before_after.png (held-out samples of the base model and of each
/// method) and DIR/demo.csv (every iteration of every method), and prints the report's table.
/// Example: `branchgrpo demo --quick --out /tmp/demo` -> 2 iterations per method, the four files.
void add_demo_command(CLI::App& app);

}  // namespace branchgrpo::cli
