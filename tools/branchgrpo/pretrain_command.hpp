#pragma once
// `branchgrpo pretrain`: flow-matching training of a tiny FLUX transformer on the procedural shapes data set
// (adapters/torch/branchgrpo/torch/shapes.hpp); it made the shipped model models/shapes-tiny (docs/model.md).
// Built only with LibTorch and TurboJPEG (branchgrpo::torch and branchgrpo_jpeg).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers the `pretrain` subcommand on `app`. It trains the model (x_t = (1 - t) x0 + t eps, target
/// v = eps - x0, AdamW, EMA) and writes DIR/model.safetensors (bfl names; __metadata__ with the flux_config and
/// the training settings), DIR/prompts.safetensors, DIR/samples.png (ODE samples: one row per prompt),
/// DIR/data.png (data set images, same layout) and DIR/pretrain.json (the summary it also prints).
/// Example: `branchgrpo pretrain --out /tmp/m --steps 20` -> {"alignment":...,"steps":20,...} and the files.
void add_pretrain_command(CLI::App& app);

}  // namespace branchgrpo::cli
