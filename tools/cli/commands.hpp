#pragma once
// The subcommands of the branchgrpo tool: one registration function each, defined in commands/<name>.cpp;
// main.cpp only dispatches. Each throws branchgrpo::invalid_input (one line naming the value) for bad input.
// pretrain, train, sample and demo exist only with the application layer (LibTorch, toml++, TurboJPEG;
// BRANCHGRPO_CLI_TORCH); otherwise main.cpp registers commands that only say what is missing.

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers the `tree` subcommand on `app`. It prints a table (or one JSON object with --json) and throws
/// branchgrpo::invalid_input, naming the value, for a topology or schedule the core rejects.
/// Example: `branchgrpo tree --json` -> {"edges":218,...,"evaluations":203,...,"leaves":16,"nodes":219,...}.
void add_tree_command(CLI::App& app);

/// Registers the `toy` subcommand on `app`. It prints per-iteration stats (JSON lines with --json) or, with
/// --compare, a table of every method (one JSON object keyed by method with --json), writes
/// toy_<method>.csv or compare.csv, reward_vs_time.png and samples_before_after.png into --out, and throws
/// branchgrpo::invalid_input, naming the value, for an unknown method or a count below its minimum.
/// Example: `branchgrpo toy --method branch --iters 3 --json` -> three lines
///   {"edges":...,"edges_trained":...,"evaluations":...,"iteration":0,...,"reward_mean":...,"seconds":...}.
void add_toy_command(CLI::App& app);

/// Registers the `compare` subcommand on `app`: dance and every BranchGRPO variant trained from one base model
/// (--model toy, or shapes with LibTorch) with N seeds; per method the held-out reward gain, the gain over dance's,
/// the held-out reward at a budget of dance's training time and the reward difference to dance at equal time (each
/// on the wall and the CPU clock), and the seconds per iteration with the ratio to dance's, each as a mean over the
/// seeds with its 95 % Student-t interval. Prints two tables (one JSON object keyed by method with --json) and
/// writes runs.csv, reward_vs_time.png, reward_vs_cpu_time.png and summary.json into --out. Throws
/// branchgrpo::invalid_input, naming the value, for an unknown model, a count out of range or sizes that do not fit.
/// Example: `branchgrpo compare --model toy --seeds 2 --iters 3 --json` ->
///   {"branch":{...,"gain_ci_high":...,"gain_ci_low":...,"gain_mean":...,...,"time_ratio_vs_dance":...},
///    "dance":{...,"time_ratio_vs_dance":1.0,...},...}.
void add_compare_command(CLI::App& app);

/// Registers the `gradient-signal` subcommand on `app`: on the toy's base model, D draws of one iteration's policy
/// gradient per method (never applied), and per band of denoising steps the signal fraction |E g|^2 / E|g|^2, the
/// alignment cos(E g, dance's E g) and the mean |advantage| of the trained edges. Prints a table (one JSON object
/// keyed by method with --json); throws branchgrpo::invalid_input, naming the value, for a bad --methods entry or
/// count. Example: `branchgrpo gradient-signal --draws 8 --json` ->
///   {"branch":{...,"signal_fraction":...,"steps_0_2":{"alignment_with_dance":...,...},...},"dance":{...},...}.
void add_gradient_signal_command(CLI::App& app);

/// Registers the `bench` subcommand (with its `iteration` subcommand) on `app`. `bench iteration` runs
/// dance, branch, branch-widpru, branch-deppru and branch-mix alternately (A B C D E A B ...) on copies of one
/// model, same seed and prompts, and prints a table (one JSON object keyed by variant with --json). Throws
/// branchgrpo::invalid_input, naming the value, for a count below its minimum or a model that was not built.
/// Example: `branchgrpo bench iteration --model toy --iters 3 --json` ->
///   {"branch":{...,"seconds_per_iter":...,"time_ratio_vs_dance":...,"overhead_fraction":...,
///    "batching_speedup":...},"dance":{...,"time_ratio_vs_dance":1.0,...},...}.
void add_bench_command(CLI::App& app);

/// Registers `bench prompts` on the `bench` command (with LibTorch; bench/prompts.cpp): a prompt dataset of --count
/// rows written in shards, read by random batches memory-mapped and loaded whole, printing the resident memory and
/// the median time per batch each way and their ratios. Throws invalid_input naming the flag for a --dir that holds
/// other files or sizes that do not fit.
/// Example: `branchgrpo bench prompts --count 2000 --shard-rows 500` -> a table of "mapped" and "in memory" rows
///   and "resident ratio mapped / in memory: ...".
void add_bench_prompts_command(CLI::App& bench);

/// Registers the `weights` subcommand on `app`. It lists the tensors of a `.safetensors` file or a sharded
/// `*.index.json` (name, dtype, shape), says which FLUX layout (bfl or diffusers) the names are in and which keys
/// are missing, unexpected or of the wrong shape for a FLUX config. A malformed file throws the reader's one-line
/// branchgrpo::invalid_input (naming the file and the tensor). Needs no LibTorch.
/// Example: `branchgrpo weights tiny.safetensors --json` -> {"config":"tiny",...,"layout":"bfl",...,"ok":true,...}.
void add_weights_command(CLI::App& app);

/// Registers the `policies` subcommand on `app`.
/// Example: `branchgrpo policies --family correlator` ->
///   "correlator ([correlator] kind)\n  correlated   shared + own draw, ...\n    s = 4.0  (>= 0)  weight of ...".
void add_policies_command(CLI::App& app);

/// Registers the `pretrain` subcommand on `app`. It trains the model (x_t = (1 - t) x0 + t eps, target
/// v = eps - x0, AdamW, EMA) and writes DIR/model.safetensors (bfl names; __metadata__ with the flux_config and
/// the training settings), DIR/prompts.safetensors, DIR/samples.png (ODE samples: one row per prompt),
/// DIR/data.png (data set images, same layout) and DIR/pretrain.json (the summary it also prints).
/// Example: `branchgrpo pretrain --out /tmp/m --steps 20` -> {"alignment":...,"steps":20,...} and the files.
void add_pretrain_command(CLI::App& app);

/// Registers `train`. It prints one line per iteration (JSON lines with --json), shows a progress bar on a
/// terminal, and writes into run.output_dir: metrics.jsonl and metrics.csv, config.toml (a copy of the config),
/// grids/iter-NNNNNN.png (the iteration's leaf images, every run.grid_every iterations and at the end) and
/// checkpoints/iter-NNNNNN/ (every run.checkpoint_every iterations and at the end; checkpoint.hpp).
/// --resume continues from the latest checkpoint; without it an output directory holding checkpoints is refused.
/// --memory prints the pre-flight memory estimate by part and the budgets, loads nothing and exits.
/// Example: `branchgrpo train --config examples/shapes_branch.toml` -> 40 iterations, out/shapes_branch/...
void add_train_command(CLI::App& app);

/// Registers `sample`: the checkpoint's weights, deterministic ODE samples of the given prompts (default: every
/// prompt of the table), a PNG grid (one row per prompt) and each row's mean reward.
/// Example: `branchgrpo sample --config run.toml --checkpoint out/run/checkpoints/iter-000040 --prompts
///   "a red circle,a blue square" --out grid.png`.
void add_sample_command(CLI::App& app);

/// Registers `export-lora`: a checkpoint's LoRA (or its EMA with --ema) in the keys of diffusers, kohya (FLUX) or
/// ComfyUI, or with --merge the whole transformer W + (alpha / rank) B A in our layout (torch/lora_export.hpp).
/// Example: `branchgrpo export-lora out/run/checkpoints/iter-000040 --format diffusers --output lora.safetensors`
///   -> "wrote lora.safetensors: 16 LoRA layers of the FLUX transformer as diffusers (48 tensors, rank 8, alpha 8)".
void add_export_lora_command(CLI::App& app);

/// Registers `demo`. It writes DIR/report.md (per method: held-out reward before and after, gain, denoiser
/// evaluations, edges, seconds per iteration and the ratio to dance), DIR/reward_vs_time.png (held-out reward
/// against cumulative training time), DIR/before_after.png (held-out samples of the base model and of each
/// method) and DIR/demo.csv (every iteration of every method), and prints the report's table.
/// Example: `branchgrpo demo --quick --out /tmp/demo` -> 2 iterations per method, the four files.
void add_demo_command(CLI::App& app);

}  // namespace branchgrpo::cli
