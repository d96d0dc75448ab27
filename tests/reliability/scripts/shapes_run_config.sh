# Sourced by the reliability scripts that drive `branchgrpo train` on the shipped shapes model
# (train_reliability.sh, stop_reliability.sh): one small run's config.
#   shapes_run_config FILE MODEL_DIR OUTPUT_DIR ITERATIONS CHECKPOINT_EVERY LR [EXTRA_TOML]
# writes FILE: a 4-step tree splitting at steps 0 and 2 into 2, LoRA rank 2, one prompt per iteration, at most 3
# checkpoints kept, no grids (about 1 s an iteration on 2 cores), then EXTRA_TOML (more tables) as given.
shapes_run_config() {
  cat > "$1" << TOML
[model]
dir = "$2"
[data]
prompts_per_iteration = 1
[topology]
split_steps = [0, 2]
branching = [2]
[rollout]
steps = 4
[optimizer]
lr = $6
[lora]
rank = 2
alpha = 2.0
[run]
iterations = $4
checkpoint_every = $5
keep_checkpoints = 3
grid_every = 0
output_dir = "$3"
${7:-}
TOML
}
