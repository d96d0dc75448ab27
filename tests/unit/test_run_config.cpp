// The run configuration of `branchgrpo train` (adapters/config: run_config.hpp, toml_reader.hpp; torch-free):
// every documented key is parsed, unknown keys and bad values are rejected with one line naming them, and the
// run-time recipe behaves like with_method's.
#include <catch2/catch.hpp>

#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "branchgrpo/config/config_text.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/config/toml_reader.hpp"

namespace bg = branchgrpo;

namespace {

// The message of the invalid_input thrown by parsing `text` ("" when it parses).
std::string error_of(const std::string& text) {
  try {
    (void)bg::parse_run_config(text, "run.toml");
  } catch (const bg::invalid_input& error) {
    return error.what();
  }
  return "";
}

// Every key of docs/config.md, each set to a value other than its default.
const char* const every_key = R"(
[model]
dir = ""
config = "tiny"
weights = "tiny.safetensors"
decoder = "ae.safetensors"
dtype = "bfloat16"
device = "cuda:1"
guidance = 4.0
latent_height = 8
latent_width = 6
gradient_checkpointing = true

[data]
embeddings = "prompts.safetensors"
prompts_per_iteration = 3
shuffle = true

[topology]
kind = "split_schedule"
split_steps = [0, 2, 4]
branching = [3, 2, 2]

[rollout]
steps = 12
shift = 2.0
max_batch = 32
stepper = "dance_sde"
eta = 0.5

[correlator]
kind = "correlated"
s = 2.0

[fusion]
kind = "path_softmax"
beta = 0.5

[advantage]
kind = "depth_wise"
scope = "per_batch"
epsilon = 1e-6
min_std = 1e-5
per_reward = true

[pruning]
active_fraction = 0.5
[[pruning.pruners]]
kind = "parent_top_k"
k = 2
[[pruning.pruners]]
kind = "depth_window"
depths = [1, 2]
width = 3
start = 1
every = 5
direction = -1
stop = 2
keep_window = true

[loss]
clip_range = 0.01
advantage_clip = 3.0
kl_beta = 0.02
ratio_norm = true
step_weight = "noise_std"

[optimizer]
lr = 3e-4
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
weight_decay = 0.01
max_grad_norm = 0.5
ema_decay = 0.9
sharding = "gradients"
bucket_mb = 8.0

[lora]
enabled = true
rank = 4
alpha = 8.0
targets = ["attention", "modulation"]

[[rewards]]
name = "alignment"
weight = 2.0
params = { colour_weight = 0.5, mode = "strict", soft = true }
[[rewards]]
name = "jpeg_compressibility"
weight = 0.25
win_rate = true

[run]
iterations = 7
seed = 42
output_dir = "out/x"
grid_every = 3
checkpoint_every = 2
keep_checkpoints = 3
updates_per_iteration = 2
)";

}  // namespace

TEST_CASE("an empty config is the documented defaults: shapes-tiny, the branch method, LoRA 16") {
  const bg::run_config c = bg::parse_run_config("", "run.toml");
  CHECK(c.model == bg::model_section{});
  CHECK(c.model.dir == "models/shapes-tiny");
  CHECK(c.data.prompts_per_iteration == 2);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.rollout.steps == 20);
  CHECK(c.rollout.shift == 3.0);
  CHECK(c.rollout.max_batch == 64);
  CHECK(bg::same_recipe(c.recipe, bg::method_recipe("branch")));
  CHECK(c.recipe.topology(20).evaluations() == 203);  // the dense tree
  CHECK(c.loss == bg::ppo_options{});
  CHECK(c.optimizer.lr == 1e-5);
  CHECK(c.run.updates_per_iteration == 1);
  CHECK(c.lora.enabled);
  CHECK(c.lora.rank == 16);
  CHECK(c.lora.targets == std::vector<std::string>{"attention", "mlp"});
  REQUIRE(c.rewards.size() == 1);
  CHECK(c.rewards[0].name == "alignment");
  CHECK(c.run.iterations == 100);
  CHECK(c.run.output_dir == "out/train");
  CHECK(c.run.checkpoint_every == 10);
  CHECK(c.source == "run.toml");
}

TEST_CASE("every documented key is parsed") {
  const bg::run_config c = bg::parse_run_config(every_key, "run.toml", "/cfg");
  CHECK(c.model.dir.empty());
  CHECK(c.model.config == "tiny");
  CHECK(c.input_path(c.model.weights) == std::filesystem::path("/cfg/tiny.safetensors"));
  CHECK(c.model.decoder == "ae.safetensors");
  CHECK(c.model.dtype == "bfloat16");
  CHECK(c.model.device == "cuda:1");
  CHECK(c.model.guidance == 4.0);
  CHECK(c.model.latent_height == 8);
  CHECK(c.model.latent_width == 6);
  CHECK(c.model.gradient_checkpointing);
  CHECK(c.data.embeddings == "prompts.safetensors");
  CHECK(c.data.prompts_per_iteration == 3);
  CHECK(c.data.shuffle);
  CHECK(c.recipe.topology.policy ==
        decltype(c.recipe.topology.policy){bg::split_schedule{.split_steps = {0, 2, 4}, .branching = {3, 2, 2}}});
  CHECK(c.recipe.topology(12).leaf_count() == 12);  // 3 * 2 * 2
  CHECK(c.rollout.steps == 12);
  CHECK(c.rollout.shift == 2.0);
  CHECK(c.rollout.max_batch == 32);
  CHECK(std::get<bg::dance_sde>(c.recipe.stepper.policy).eta == 0.5);
  CHECK(std::get<bg::correlated>(c.recipe.correlator.policy).s == 2.0);
  CHECK(std::get<bg::path_softmax>(c.recipe.fusion.policy).beta == 0.5);
  const auto& dw = std::get<bg::depth_wise>(c.recipe.normalizer.normalizer.policy);
  CHECK(dw.scope == bg::normalization_scope::per_batch);
  CHECK(dw.epsilon == 1e-6);
  CHECK(dw.min_std == 1e-5);
  CHECK(c.recipe.normalizer.per_reward);
  CHECK(c.recipe.normalizer.parts.fusion == c.recipe.fusion);  // each part fused with the run's [fusion]
  CHECK(c.recipe.pruner.fraction == 0.5);
  REQUIRE(c.recipe.pruner.pruner.pruners.size() == 2);
  CHECK(std::get<bg::parent_top_k>(c.recipe.pruner.pruner.pruners[0].policy).k == 2);
  CHECK(std::get<bg::depth_window>(c.recipe.pruner.pruner.pruners[1].policy) ==
        bg::depth_window{
            .depths = {1, 2}, .width = 3, .start = 1, .every = 5, .direction = -1, .stop = 2, .keep_window = true});
  CHECK(c.loss == bg::ppo_options{.clip_range = 0.01,
                                  .advantage_clip = 3.0,
                                  .kl_beta = 0.02,
                                  .ratio_norm = true,
                                  .step_weight = bg::step_weighting::noise_std});
  CHECK(c.sharding == bg::sharding_options{.mode = bg::sharding_mode::gradients, .bucket_megabytes = 8});
  CHECK(c.optimizer == bg::optimizer_options{.lr = 3e-4,
                                             .beta1 = 0.8,
                                             .beta2 = 0.99,
                                             .eps = 1e-6,
                                             .weight_decay = 0.01,
                                             .max_grad_norm = 0.5,
                                             .ema_decay = 0.9});
  CHECK(c.lora == bg::lora_section{.enabled = true, .rank = 4, .alpha = 8.0, .targets = {"attention", "modulation"}});
  REQUIRE(c.rewards.size() == 2);
  CHECK(c.rewards[0].name == "alignment");
  CHECK(c.rewards[0].weight == 2.0);
  CHECK(std::get<double>(c.rewards[0].params.at("colour_weight")) == 0.5);
  CHECK(std::get<std::string>(c.rewards[0].params.at("mode")) == "strict");
  CHECK(std::get<bool>(c.rewards[0].params.at("soft")));
  CHECK(c.rewards[1].name == "jpeg_compressibility");
  CHECK(c.rewards[1].weight == 0.25);
  CHECK(!c.rewards[0].win_rate);
  CHECK(c.rewards[1].win_rate);
  CHECK(c.run == bg::run_section{.iterations = 7,
                                 .seed = 42,
                                 .output_dir = "out/x",
                                 .grid_every = 3,
                                 .checkpoint_every = 2,
                                 .keep_checkpoints = 3,
                                 .updates_per_iteration = 2});
  CHECK(c.training().total_iterations == 7);
  CHECK(c.training().seed == 42);
  CHECK(c.training().updates_per_iteration == 2);
}

TEST_CASE("the other kinds of each family and their keys") {
  const bg::run_config c = bg::parse_run_config(R"(
[topology]
kind = "sequential"
group_size = 4
shared_root = false
[rollout]
stepper = "flow_grpo_sde"
noise_level = 0.5
[correlator]
kind = "scaled"
scale = 3.0
[fusion]
kind = "split_softmax"
alpha = 2.0
[advantage]
kind = "per_prompt_running"
history = 8
epsilon = 0.01
global_std = true
[[pruning.pruners]]
kind = "sde_window"
width = 2
start = 1
every = 3
stride = 2
train_splits = false
[[pruning.pruners]]
kind = "extreme"
b = 2
[[pruning.pruners]]
kind = "keep_all"
)",
                                                "run.toml");
  CHECK(c.recipe.topology(20).evaluations() == 80);  // 4 separate chains of 20 steps
  CHECK(std::get<bg::flow_grpo_sde>(c.recipe.stepper.policy).noise_level == 0.5);
  CHECK(std::get<bg::scaled>(c.recipe.correlator.policy).scale == 3.0);
  CHECK(std::get<bg::split_softmax>(c.recipe.fusion.policy).alpha == 2.0);
  const auto& running = std::get<bg::per_prompt_running>(c.recipe.normalizer.normalizer.policy);
  CHECK(running.history == 8);
  CHECK(running.epsilon == 0.01);
  CHECK(running.global_std);
  REQUIRE(c.recipe.pruner.pruner.pruners.size() == 3);
  CHECK(std::get<bg::sde_window>(c.recipe.pruner.pruner.pruners[0].policy) ==
        bg::sde_window{.width = 2, .start = 1, .every = 3, .stride = 2, .train_splits = false});
  CHECK(std::get<bg::extreme>(c.recipe.pruner.pruner.pruners[1].policy).b == 2);
  CHECK(std::holds_alternative<bg::keep_all>(c.recipe.pruner.pruner.pruners[2].policy));

  const bg::run_config fast = bg::parse_run_config(R"(
[topology]
kind = "flow_grpo_fast"
group_size = 8
split_step = 2
sde_steps = 3
[correlator]
kind = "antithetic"
[fusion]
kind = "max_reward"
[advantage]
kind = "leaf_group"
epsilon = 1e-3
min_std = 1e-4
)",
                                                   "run.toml");
  CHECK(std::get<bg::flow_grpo_fast>(fast.recipe.topology.policy) ==
        bg::flow_grpo_fast{.group_size = 8, .split_step = 2, .sde_steps = 3});
  CHECK(std::holds_alternative<bg::antithetic>(fast.recipe.correlator.policy));
  CHECK(std::holds_alternative<bg::max_reward>(fast.recipe.fusion.policy));
  CHECK(std::get<bg::leaf_group>(fast.recipe.normalizer.normalizer.policy).min_std == 1e-4);
  CHECK(std::holds_alternative<bg::independent>(
      bg::parse_run_config("[correlator]\nkind = \"independent\"\n", "r").recipe.correlator.policy));
  CHECK(std::holds_alternative<bg::orthogonal>(
      bg::parse_run_config("[correlator]\nkind = \"orthogonal\"\n", "r").recipe.correlator.policy));
}

TEST_CASE("[rollout] stepper = \"cps\" and \"per_layer_eta\" with their parameters") {
  CHECK(bg::parse_run_config("[rollout]\nstepper = \"cps\"\n", "r").recipe.stepper == bg::any_stepper{bg::cps{}});
  CHECK(std::get<bg::cps>(bg::parse_run_config("[rollout]\nstepper = \"cps\"\neta = 0.5\n", "r").recipe.stepper.policy)
            .eta == 0.5);
  const bg::run_config layered =
      bg::parse_run_config("[rollout]\nstepper = \"per_layer_eta\"\netas = [0.9, 1, 0.5]\nsampler = \"cps\"\n", "r");
  CHECK(std::get<bg::per_layer_eta>(layered.recipe.stepper.policy) ==
        bg::per_layer_eta{.etas = {0.9, 1.0, 0.5}, .sampler = bg::layer_sampler::cps});
  // The config text (what a checkpoint records) names them as a config writes them.
  const std::string text = bg::config_text(layered, false);
  CHECK_THAT(text, Catch::Matchers::Contains("rollout.stepper = \"per_layer_eta\"\nrollout.etas = [0.9, 1.0, 0.5]\n"
                                             "rollout.sampler = \"cps\"\n"));
  CHECK(error_of("[rollout]\nstepper = \"cps\"\neta = 1.5\n") == "run.toml: rollout.eta = 1.5: must be in [0.0001, 1]");
  CHECK(error_of("[rollout]\nstepper = \"per_layer_eta\"\netas = []\n") ==
        "run.toml: rollout.etas = []: must not be empty");
  CHECK(error_of("[rollout]\nstepper = \"per_layer_eta\"\netas = [0.3, -1]\n") ==
        "run.toml: rollout.etas = [ 0.3, -1 ]: must hold values >= 1e-04");
  CHECK(error_of("[rollout]\nstepper = \"per_layer_eta\"\netas = [0.3, \"x\"]\n") ==
        "run.toml: rollout.etas = [ 0.3, 'x' ]: must be an array of numbers");
  CHECK(error_of("[rollout]\nstepper = \"per_layer_eta\"\nsampler = \"ode\"\n") ==
        "run.toml: rollout.sampler = 'ode': must be dance_sde or cps");
  CHECK(error_of("[rollout]\nstepper = \"cps\"\netas = [0.3]\n") ==
        "run.toml: rollout.etas = [ 0.3 ]: is not used by rollout.stepper = \"cps\"");
}

TEST_CASE("unknown keys are rejected with one line naming them") {
  CHECK(error_of("[rollout]\nstepz = 3\n") ==
        "run.toml: unknown key rollout.stepz (rollout has: decode_batch, eta, etas, max_batch, noise_level, sampler, "
        "shift, stepper, steps)");
  CHECK(error_of("[rolout]\nsteps = 3\n").rfind("run.toml: unknown key rolout (sections: ", 0) == 0);
  CHECK(error_of("[[pruning.pruners]]\nkind = \"parent_top_k\"\nkk = 1\n")
            .rfind("run.toml: unknown key pruning.pruners[0].kk (pruning.pruners[0] has: ", 0) == 0);
  CHECK(
      error_of("[[rewards]]\nname = \"alignment\"\nweigth = 1\n").rfind("run.toml: unknown key rewards[0].weigth", 0) ==
      0);
  // A key of another kind is named with the kind that does not use it.
  CHECK(error_of("[correlator]\nkind = \"scaled\"\ns = 2\n") ==
        "run.toml: correlator.s = 2: is not used by correlator.kind = \"scaled\"");
  CHECK(error_of("[topology]\nkind = \"split_schedule\"\ngroup_size = 4\n") ==
        "run.toml: topology.group_size = 4: is not used by topology.kind = \"split_schedule\"");
  CHECK(error_of("[rollout]\nstepper = \"flow_grpo_sde\"\neta = 0.3\n") ==
        "run.toml: rollout.eta = 0.3: is not used by rollout.stepper = \"flow_grpo_sde\"");
}

TEST_CASE("values far out of range are refused by key, not met later as a NaN", "[reliability]") {
  // Each of these passed the reader before (finite, or positive) and failed at run time naming nothing.
  CHECK(error_of("[optimizer]\nlr = 1e300\n") == "run.toml: optimizer.lr = 1e+300: must be in [1e-12, 1]");
  CHECK(error_of("[optimizer]\nlr = 5e-324\n") == "run.toml: optimizer.lr = 5e-324: must be in [1e-12, 1]");
  CHECK(error_of("[optimizer]\nweight_decay = 1e300\n") ==
        "run.toml: optimizer.weight_decay = 1e+300: must be in [0, 100]");
  CHECK(error_of("[optimizer]\neps = 5e-324\n") == "run.toml: optimizer.eps = 5e-324: must be in [1e-30, 1]");
  CHECK(error_of("[rollout]\neta = 5e-324\n") == "run.toml: rollout.eta = 5e-324: must be in [0.0001, 10]");
  CHECK(error_of("[rollout]\nshift = 1e300\n") == "run.toml: rollout.shift = 1e+300: must be in [0.001, 1000]");
  CHECK(error_of("[lora]\nalpha = 1e300\n") == "run.toml: lora.alpha = 1e+300: must be in [1e-6, 1000000]");
  CHECK(error_of("[[rewards]]\nname = \"alignment\"\nweight = 1e300\n") ==
        "run.toml: rewards[0].weight = 1e+300: must be in [-1000000, 1000000]");
  CHECK(error_of("[advantage]\nepsilon = 1e300\n") == "run.toml: advantage.epsilon = 1e+300: must be in [0, 1]");
  // inf is refused like nan.
  CHECK(error_of("[loss]\nadvantage_clip = inf\n") == "run.toml: loss.advantage_clip = inf: must be in [0.001, 1000]");
  CHECK(error_of("[loss]\nadvantage_clip = nan\n") == "run.toml: loss.advantage_clip = nan: must be in [0.001, 1000]");
  // An sde_window start with no room for its width at iteration 0 (it was clamped silently).
  CHECK(error_of("[[pruning.pruners]]\nkind = \"sde_window\"\nwidth = 4\nstart = 25\n") ==
        "run.toml: pruning.pruners[0]: sde_window start 25 leaves no room for width 4 in 20 steps (at most 16)");
  // A multistep ODE solver on a topology it cannot serve: splits every second step leave ODE runs of one step.
  CHECK(error_of("[topology]\nkind = \"split_schedule\"\nsplit_steps = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]\n"
                 "[[pruning.pruners]]\nkind = \"sde_window\"\nsolver = \"dpm_solver_2m\"\n") ==
        "run.toml: pruning.pruners[0]: sde_window solver dpm_solver_2m cannot serve this topology: its longest stretch "
        "of steps without a split is 1, a second-order step at ode_stride 1 needs 2");
  CHECK(error_of("[[pruning.pruners]]\nkind = \"sde_window\"\nsolver = \"heun\"\n") ==
        "run.toml: pruning.pruners[0].solver = 'heun': must be euler or dpm_solver_2m");
}

TEST_CASE("value pruning, dense rewards, adaptive branching: their bad inputs name the key",
          "[value_pruning][step_gain][adaptive_branching]") {
  // The dense tree's last split is step 9.
  CHECK(error_of("[[pruning.pruners]]\nkind = \"value\"\nstep = 12\n") ==
        "run.toml: pruning.pruners[0]: value pruning step = 12 is past the last split (step 9): nothing is left to "
        "prune");
  CHECK(error_of("[[pruning.pruners]]\nkind = \"value\"\nkeep = 0\n") ==
        "run.toml: pruning.pruners[0].keep = 0: must be at least 1");
  CHECK(error_of("[[pruning.pruners]]\nkind = \"value\"\npruned = \"keep\"\n") ==
        "run.toml: pruning.pruners[0].pruned = 'keep': must be value or drop");
  CHECK(error_of("[[pruning.pruners]]\nkind = \"value\"\n[objective]\nkind = \"nft\"\n") ==
        "run.toml: pruning.pruners: the value pruner needs an objective that trains transitions (objective.kind = "
        "nft trains on the leaves' samples)");
  CHECK(error_of("[fusion]\nkind = \"step_gain\"\nweight = 2\n") == "run.toml: fusion.weight = 2: must be in [0, 1]");
  CHECK(error_of("[fusion]\nkind = \"step_gain\"\n[advantage]\nper_reward = true\n") ==
        "run.toml: advantage.per_reward = true: the fusion step_gain reads node values of the total reward; "
        "per-reward parts have none");
  CHECK(error_of("[topology]\nkind = \"adaptive_branching\"\nbudget = 10\n") ==
        "run.toml: topology.budget = 10: adaptive_branching budget = 10 is below one chain per prompt (20 evaluations "
        "over 20 steps)");
  CHECK(error_of("[topology]\nkind = \"adaptive_branching\"\nbranching = 1\n") ==
        "run.toml: topology.branching = 1: must be at least 2");
  CHECK(error_of("[fusion]\nkind = \"step_gain\"\nweight = 1\n[[pruning.pruners]]\nkind = \"value\"\nkeep = 2\n") ==
        "");
}

TEST_CASE("lists have a count limit and long values are echoed cut", "[reliability]") {
  std::string rewards;
  for (int i = 0; i < 300; ++i) rewards += "[[rewards]]\nname = \"alignment\"\n";
  CHECK(error_of(rewards) == "run.toml: rewards: 300 entries, at most 256 are supported");
  std::string targets = "[lora]\ntargets = [";
  for (int i = 0; i < 100000; ++i) targets += "\"mlp\", ";
  targets += "\"mlp\"]\n";
  CHECK(error_of(targets) ==
        "run.toml: lora.targets = [... 100001 elements]: holds 100001 elements, at most 256 are "
        "supported");
  // A huge string is echoed as its start and end: one short line.
  const std::string device = "[model]\ndevice = \"" + std::string(1'000'000, 'x') + "\"\n";
  const std::string message = error_of(device);
  CHECK(message.starts_with("run.toml: model.device = \"xxx"));
  CHECK(message.ends_with("xxx\": must be cpu, cuda or cuda:N"));
  CHECK(message.size() < 160);
}

TEST_CASE("bad values are rejected with one line naming the key and the value") {
  CHECK(error_of("[rollout]\nsteps = 0\n") == "run.toml: rollout.steps = 0: must be at least 1");
  CHECK(error_of("[rollout]\nsteps = \"abc\"\n") == "run.toml: rollout.steps = 'abc': must be an integer");
  CHECK(error_of("[rollout]\nshift = -1\n") == "run.toml: rollout.shift = -1: must be in [0.001, 1000]");
  CHECK(error_of("[rollout]\nmax_batch = 0\n") == "run.toml: rollout.max_batch = 0: must be at least 1");
  CHECK(error_of("[rollout]\nstepper = \"euler\"\n") ==
        "run.toml: rollout.stepper = 'euler': must be dance_sde, flow_grpo_sde, cps or per_layer_eta");
  CHECK(error_of("[topology]\nkind = \"star\"\n") ==
        "run.toml: topology.kind = 'star': must be split_schedule, sequential, flow_grpo_fast or adaptive_branching");
  CHECK(error_of("[topology]\nsplit_steps = [0, 3, 25]\n") ==
        "run.toml: topology.split_steps = [ 0, 3, 25 ]: split step 25 is not in [0, 20)");
  CHECK(error_of("[topology]\nbranching = [0]\n") == "run.toml: topology.branching = [ 0 ]: must hold values >= 1");
  // What the rules cannot see, the policy's own validation says, naming the keys involved.
  CHECK(error_of("[topology]\nsplit_steps = [0, 3]\nbranching = [2, 2, 2]\n")
            .rfind("run.toml: topology.split_steps = [ 0, 3 ], topology.branching = [ 2, 2, 2 ]: ", 0) == 0);
  CHECK(error_of("[correlator]\nkind = \"scaled\"\nscale = 0\n") ==
        "run.toml: correlator.scale = 0: must be in [0.001, 1000]");
  CHECK(error_of("[advantage]\nscope = \"global\"\n") ==
        "run.toml: advantage.scope = 'global': must be per_tree, per_batch, pooled or leaf_scaled");
  CHECK(error_of("[pruning]\nactive_fraction = 1.5\n") == "run.toml: pruning.active_fraction = 1.5: must be in [0, 1]");
  CHECK(error_of("[[pruning.pruners]]\nk = 1\n") ==
        "run.toml: pruning.pruners[0]: needs a kind (keep_all, parent_top_k, depth_window, sde_window, extreme or "
        "value)");
  CHECK(error_of("[[pruning.pruners]]\nkind = \"parent_top_k\"\nk = 0\n") ==
        "run.toml: pruning.pruners[0].k = 0: must be at least 1");
  CHECK(error_of("[[pruning.pruners]]\nkind = \"sde_window\"\nwidth = 30\n") ==
        "run.toml: pruning.pruners[0]: sde_window width 30 is not in [1, 20]");
  CHECK(error_of("[loss]\nclip_range = 0\n") == "run.toml: loss.clip_range = 0: must be in (0, 1)");
  CHECK(error_of("[loss]\nkl_beta = 0.1\n[lora]\nenabled = false\n") ==
        "run.toml: loss.kl_beta = 0.1: needs lora.enabled = true (the frozen base without the adapters is the KL "
        "reference)");
  CHECK(error_of("[optimizer]\nlr = 0\n") == "run.toml: optimizer.lr = 0: must be in [1e-12, 1]");
  CHECK(error_of("[optimizer]\nlr = -1e-3\n") == "run.toml: optimizer.lr = -0.001: must be in [1e-12, 1]");
  CHECK(error_of("[rollout]\nsteps = 5\n") == "run.toml: topology (defaults): split step 6 is not in [0, 5)");
  CHECK(error_of("[optimizer]\nlr = nan\n") == "run.toml: optimizer.lr = nan: must be in [1e-12, 1]");
  CHECK(error_of("[optimizer]\nbeta2 = 1.0\n") == "run.toml: optimizer.beta2 = 1.0: must be in [0, 1)");
  CHECK(error_of("[run]\nupdates_per_iteration = 0\n") ==
        "run.toml: run.updates_per_iteration = 0: must be at least 1");
  // updates_per_iteration is a training option, not an optimizer's.
  CHECK(error_of("[optimizer]\nupdates_per_iteration = 2\n")
            .rfind("run.toml: unknown key optimizer.updates_per_iteration", 0) == 0);
  CHECK(error_of("[lora]\nrank = 0\n") == "run.toml: lora.rank = 0: must be at least 1");
  CHECK(error_of("[lora]\ntargets = [\"qkv\"]\n") ==
        "run.toml: lora.targets = [ 'qkv' ]: unknown target \"qkv\" (attention, mlp, modulation or embedding)");
  CHECK(error_of("[lora]\nenabled = 1\n") == "run.toml: lora.enabled = 1: must be true or false");
  CHECK(error_of("[[rewards]]\nname = \"hps\"\n") ==
        "run.toml: rewards[0].name = 'hps': must be alignment, jpeg_compressibility, jpeg_incompressibility, "
        "smoothness, torchscript, remote or vlm_judge");
  CHECK(error_of("[[rewards]]\nweight = 1\n").rfind("run.toml: rewards[0]: needs a name (alignment, ", 0) == 0);
  CHECK(error_of("rewards = []\n") == "run.toml: rewards = []: needs at least one [[rewards]] entry");
  CHECK(error_of("[run]\niterations = 0\n") == "run.toml: run.iterations = 0: must be at least 1");
  CHECK(error_of("[run]\nseed = -1\n") == "run.toml: run.seed = -1: must be non-negative");
  CHECK(error_of("[run]\ncheckpoint_every = -2\n") == "run.toml: run.checkpoint_every = -2: must be at least 0");
  CHECK(error_of("[model]\ndtype = \"float64\"\n") ==
        "run.toml: model.dtype = 'float64': must be float32, bfloat16 or float16");
  CHECK(error_of("[model]\ndevice = \"tpu\"\n") == "run.toml: model.device = 'tpu': must be cpu, cuda or cuda:N");
  // Checked up front instead of as a LibTorch kernel error (and stack trace) in the first iteration.
  CHECK(error_of("[model]\ndtype = \"float16\"\n") ==
        "run.toml: model.dtype = \"float16\", model.device = \"cpu\": float16 needs a CUDA device (LibTorch's CPU "
        "kernels lack float16 matrix products); use bfloat16 or float32 on the CPU");
  CHECK(error_of("[model]\nlatent_height = 1000000\n") ==
        "run.toml: model.latent_height = 1000000: must be in [0, 4096]");
  CHECK(error_of("[model]\nconfig = \"tiny\"\n") ==
        "run.toml: model.config = 'tiny': model.config is for weights without a model directory: set model.dir = "
        "\"\" to use it");
  CHECK(error_of("[model]\ndir = \"\"\nconfig = \"dev\"\n") ==
        "run.toml: model.weights = \"\": model.config = \"dev\" needs its checkpoint");
  CHECK(error_of("[model]\ndir = \"\"\nconfig = \"wan-tiny\"\nlatent_height = 8\nlatent_width = 8\n") ==
        "run.toml: model.latent_frames = 0: model.config = \"wan-tiny\" is a video model and needs it");
  CHECK(error_of("[model]\ndir = \"\"\nconfig = \"tiny\"\nlatent_height = 8\nlatent_width = 8\nlatent_frames = 4\n") ==
        "run.toml: model.latent_frames = 4: is for video models; model.config = \"tiny\" makes images");
  CHECK(error_of("[model]\nlatent_frames = 5000\n") == "run.toml: model.latent_frames = 5000: must be in [0, 1024]");
  // A second expert's guidance (Wan2.2): the named config's default, refused for a family of one expert.
  const bg::run_config a14b = bg::parse_run_config(
      "[model]\ndir = \"\"\nconfig = \"wan2.2-t2v-a14b\"\nweights = \"w\"\nlatent_frames = 2\nlatent_height = 8\n"
      "latent_width = 8\n[data]\nembeddings = \"p.safetensors\"\n",
      "run.toml");
  CHECK(a14b.model.guidance_scale == 4.0);
  CHECK(a14b.model.guidance_scale_2 == 3.0);
  CHECK(a14b.model.guided());
  CHECK(error_of("[model]\ndir = \"\"\nconfig = \"sd3-tiny\"\nguidance_scale_2 = 3.0\n") ==
        "run.toml: model.guidance_scale_2 = 3.0: is a second expert's scale, and model.config = \"sd3-tiny\" (SD3) has "
        "one expert");
  CHECK(error_of("[model]\nguidance_scale_2 = -1.0\n") ==
        "run.toml: model.guidance_scale_2 = -1.0: must be in [0, 100]");
  CHECK(error_of("[data]\nprompts_per_iteration = 0\n") ==
        "run.toml: data.prompts_per_iteration = 0: must be at least 1");
  // Syntax errors name the line and column.
  CHECK(error_of("[rollout\n").rfind("run.toml:1:", 0) == 0);
  // Every message is one line.
  CHECK(error_of("[lora]\ntargets = [\n\"qkv\",\n]\n").find('\n') == std::string::npos);
}

TEST_CASE("load_run_config names an unreadable file") {
  CHECK_THROWS_WITH(bg::load_run_config("/nonexistent/run.toml"),
                    "/nonexistent/run.toml: cannot open the config file: No such file or directory");
}

TEST_CASE("[objective] chooses the update's objective; a transition option beside a decoupled one is one line") {
  CHECK(bg::parse_run_config("", "r").recipe.objective == bg::any_objective{bg::ppo_ratio{}});
  const bg::run_config nft = bg::parse_run_config(
      "[objective]\nkind = \"nft\"\nbeta = 0.5\ntimes_per_sample = 2\nintermediate_nodes = true\n", "r");
  CHECK(std::get<bg::diffusion_nft>(nft.recipe.objective.policy) ==
        bg::diffusion_nft{.beta = 0.5, .times_per_sample = 2, .intermediate_nodes = true});
  const bg::run_config awm =
      bg::parse_run_config("[objective]\nkind = \"awm\"\nweighting = \"t_squared\"\nclip_range = 0.01\n", "r");
  CHECK(std::get<bg::advantage_weighted_matching>(awm.recipe.objective.policy) ==
        bg::advantage_weighted_matching{.weighting = bg::time_weighting::t_squared, .clip_range = 0.01});
  // The canonical text holds the objective (so a checkpoint records it) and reads back to it; a PPO run's text
  // has no objective key, as before the table existed.
  const std::string text = bg::config_text(nft, false);
  CHECK_THAT(text, Catch::Matchers::Contains("objective.kind = \"nft\"\nobjective.beta = 0.5\n"
                                             "objective.times_per_sample = 2\n"));
  CHECK(bg::parse_run_config(text, "r").recipe.objective == nft.recipe.objective);
  CHECK(bg::config_text(bg::parse_run_config("", "r"), false).find("objective.") == std::string::npos);
  // The named decoupled methods are their recipes with the objective.
  CHECK(bg::method_recipe("branch-nft").objective == bg::any_objective{bg::diffusion_nft{}});
  CHECK(bg::method_recipe("awm").objective.name() == "awm");
  CHECK(bg::method_recipe("awm").topology(20).evaluations() == 305);  // dance's chains
  // Out of range, unknown, and the loss options that need a transition's ratio.
  CHECK(error_of("[objective]\nkind = \"nft\"\nbeta = 0\n") ==
        "run.toml: objective.beta = 0: must be in [1e-6, 1000000]");
  CHECK(error_of("[objective]\nkind = \"awm\"\ntimes_per_sample = 0\n") ==
        "run.toml: objective.times_per_sample = 0: must be in [1, 256]");
  CHECK(error_of("[objective]\nkind = \"awm\"\nclip_range = 1\n") ==
        "run.toml: objective.clip_range = 1: must be in (0, 1)");
  CHECK(error_of("[objective]\nkind = \"dpo\"\n") == "run.toml: objective.kind = 'dpo': must be ppo, awm, nft or dppo");
  CHECK(error_of("[objective]\nkind = \"ppo\"\nbeta = 1\n") ==
        "run.toml: objective.beta = 1: is not used by objective.kind = \"ppo\"");
  CHECK(error_of("[objective]\nkind = \"nft\"\n[loss]\nratio_norm = true\n") ==
        "run.toml: loss.ratio_norm = true with objective.kind = \"nft\": RatioNorm normalizes a transition's "
        "importance ratio, and this objective has none (objective ppo only)");
  CHECK(error_of("[objective]\nkind = \"awm\"\n[loss]\nkl_beta = 0.1\n") ==
        "run.toml: loss.kl_beta = 0.1 with objective.kind = \"awm\": the KL term is defined on transition log-probs "
        "(objectives ppo and dppo)");
  CHECK(error_of("[objective]\nkind = \"awm\"\n[loss]\nstep_weight = \"noise_std\"\n") ==
        "run.toml: loss.step_weight = \"noise_std\" with objective.kind = \"awm\": per-step weights weigh denoising "
        "transitions, and this objective trains none (objectives ppo and dppo)");
  CHECK(error_of("[objective]\nkind = \"dppo\"\nkl_threshold = 0\n") ==
        "run.toml: objective.kl_threshold = 0: must be positive");
  CHECK(error_of("[objective]\nkind = \"dppo\"\n[loss]\nratio_norm = true\n") ==
        "run.toml: loss.ratio_norm = true with objective.kind = \"dppo\": RatioNorm normalizes the ratio PPO clips, "
        "and this objective bounds the step KL instead (objective ppo only)");
}

TEST_CASE("method_recipe mirrors with_method") {
  // Every named method: the paper's five, MixGRPO-Flash's and the decoupled objectives'.
  std::vector<std::string_view> names(bg::method_names.begin(), bg::method_names.end());
  names.insert(names.end(), bg::flash_method_names.begin(), bg::flash_method_names.end());
  names.insert(names.end(), bg::decoupled_method_names.begin(), bg::decoupled_method_names.end());
  names.insert(names.end(), bg::adaptive_method_names.begin(), bg::adaptive_method_names.end());
  for (const std::string_view name : names)
    bg::with_method(name, [&](auto recipe) {
      CAPTURE(name);
      const bg::run_recipe r = bg::method_recipe(name);
      CHECK(r.topology(20) == recipe.topology(20));
      CHECK(r.stepper(bg::shifted_linear_schedule(20), 3, 1) == recipe.stepper(bg::shifted_linear_schedule(20), 3));
      for (const int iteration : {0, 7})
        CHECK(r.pruner.shape(r.topology(20), iteration) ==
              bg::shape_plan(recipe.pruner, recipe.topology(20), iteration));
      CHECK(r.objective == bg::any_objective{recipe.objective});
    });
  // branch-mix-flash from a config file: the SDE window with MixGRPO-Flash's stride and solver.
  const bg::run_config flash = bg::parse_run_config(
      "[[pruning.pruners]]\nkind = \"sde_window\"\node_stride = 3\nsolver = \"dpm_solver_2m\"\n", "run.toml");
  CHECK(flash.recipe.pruner.shape(flash.recipe.topology(20), 0).evaluations() == 95);
  CHECK(flash.recipe.pruner.shape(flash.recipe.topology(20), 0) ==
        bg::method_recipe("branch-mix-flash").pruner.shape(bg::method_recipe("branch-mix-flash").topology(20), 0));
  CHECK(bg::method_recipe("dance").topology(20).evaluations() == 305);
  CHECK(bg::method_recipe("branch-widpru").pruner.pruner.pruners.size() == 1);
  CHECK(bg::method_recipe("branch").pruner.pruner.pruners.empty());
  CHECK_THROWS_WITH(bg::method_recipe("grpo"), Catch::Contains("unknown method 'grpo'"));
}

TEST_CASE("any_pruner intersects its members and is active for a fraction of the run") {
  // Tree {steps 4, splits {0, 2}, K 2}: nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12, leaf rewards
  // {0.1, 0.5, 0.9, 0.3}: extreme{} keeps {0, 1,1, 1,1, 1,0,1,0, 1,0,1,0} (combinators.hpp's example).
  const bg::rollout_tree tree(bg::split_schedule{.split_steps = {0, 2}, .branching = {2}}(4),
                              {bg::tree_info{.key = 0, .prompt = 0}});
  const std::vector<double> leaves = {0.1, 0.5, 0.9, 0.3};
  const std::vector<double> fused = bg::uniform_mean{}(tree, leaves);
  const bg::any_pruner both{.pruner = {.pruners = {bg::extreme{}, bg::depth_window{.depths = {0}}}}, .fraction = 0.5};
  const bg::prune_context early{.iteration = 0, .total_iterations = 4, .leaf_rewards = leaves, .fused = fused};
  const bg::prune_context late{.iteration = 2, .total_iterations = 4, .leaf_rewards = leaves, .fused = fused};
  CHECK(both(tree, early) == bg::edge_mask{0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(both(tree, late) == bg::trainable_edges(tree));  // 2 >= 0.5 * 4: inactive
  CHECK(bg::any_pruner{}(tree, early) == bg::trainable_edges(tree));
  static_assert(bg::RolloutShaper<bg::any_pruner>);
  static_assert(bg::Topology<bg::any_topology>);
  static_assert(bg::Stepper<bg::any_stepper>);
  static_assert(bg::NoiseCorrelator<bg::any_correlator>);
  static_assert(bg::Fusion<bg::any_fusion>);
  static_assert(bg::Normalizer<bg::any_normalizer>);
}

#ifdef BRANCHGRPO_EXAMPLES_DIR
TEST_CASE("the example configs parse") {
  const std::filesystem::path dir = BRANCHGRPO_EXAMPLES_DIR;
  const bg::run_config shapes = bg::load_run_config(dir / "shapes_branch.toml");
  CHECK(shapes.input_path(shapes.model.dir) == dir / "../models/shapes-tiny");
  CHECK(shapes.recipe.topology(shapes.rollout.steps).evaluations() == 203);
  CHECK(shapes.recipe.pruner.pruner.pruners.size() == 1);
  CHECK(shapes.rewards.size() == 2);
  const bg::run_config dev = bg::load_run_config(dir / "flux_dev_branch.toml");
  CHECK(dev.model.config == "dev");
  CHECK(dev.input_path(dev.model.decoder) == dir / "weights/ae.safetensors");
  CHECK(dev.rewards.front().name == "torchscript");
  const bg::run_config wan = bg::load_run_config(dir / "wan_t2v_1_3b_lora.toml");
  CHECK(wan.model.config == "wan-t2v-1.3b");
  CHECK(wan.model.latent_frames == 5);
  CHECK(wan.rollout.shift == 5.0);
  const bg::run_config sd3 = bg::load_run_config(dir / "sd3_medium_lora.toml");
  CHECK(sd3.model.config == "sd3.5-medium");
  CHECK(sd3.model.guidance_scale == 4.5);
  CHECK(sd3.recipe.topology(sd3.rollout.steps).evaluations() == 77);  // 1 + 2 x 2 + 4 x 2 + 8 x 2 + 16 x 3
  const bg::run_config video = bg::load_run_config(dir / "moving_shapes_branch.toml");
  CHECK(video.input_path(video.model.dir) == dir / "../models/moving-shapes-tiny");
  CHECK(video.rewards.size() == 2);
  CHECK(video.rewards.back().name == "smoothness");
}
#endif

namespace {

// A fusion weighting defined only here: the fused reward of a node is its best leaf's reward times `scale`.
struct scaled_best {
  static constexpr std::string_view name = "scaled_best";
  static constexpr std::string_view summary = "best leaf times scale";
  double scale = 2.0;
  static constexpr auto parameters() {
    return std::tuple{bg::parameter("scale", &scaled_best::scale, "multiplies the best leaf", bg::rules::positive{})};
  }
  std::vector<double> operator()(const bg::rollout_tree& tree, std::span<const double> leaf_rewards) const {
    std::vector<double> fused = bg::max_reward{}(tree, leaf_rewards);
    for (double& r : fused) r *= scale;
    return fused;
  }
  friend bool operator==(const scaled_best&, const scaled_best&) = default;
};

// The fusion family plus one entry.
using extended_fusions = bg::extended_policy_list<bg::fusion_policies, scaled_best>;

bg::any_policy<extended_fusions> read_fusion(const std::string& text) {
  const toml::table root = toml::parse(text);
  bg::config::table_reader top("run.toml", "", &root);
  bg::config::table_reader r = top.table("fusion");
  bg::any_policy<extended_fusions> fusion;
  bg::config::read_policy(r, "kind", fusion);
  r.finish();
  return fusion;
}

std::string fusion_error(const std::string& text) {
  try {
    (void)read_fusion(text);
  } catch (const bg::invalid_input& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a policy defined outside the library plus one list entry is readable from TOML") {
  const auto fusion = read_fusion("[fusion]\nkind = \"scaled_best\"\nscale = 0.5\n");
  REQUIRE(std::holds_alternative<scaled_best>(fusion.policy));
  CHECK(std::get<scaled_best>(fusion.policy).scale == 0.5);
  CHECK(fusion.name() == "scaled_best");
  static_assert(bg::Fusion<bg::any_policy<extended_fusions>>);
  const bg::rollout_tree tree(bg::split_schedule{.split_steps = {0, 2}, .branching = {2}}(4),
                              {bg::tree_info{.key = 0, .prompt = 0}});
  const std::vector<double> leaves = {0.1, 0.5, 0.9, 0.3};
  CHECK(fusion(tree, leaves)[0] == 0.45);  // the root's best leaf 0.9 times 0.5
  // Its default, its rule and the family's other keys, in the same words as the built-in policies'.
  CHECK(std::get<scaled_best>(read_fusion("[fusion]\nkind = \"scaled_best\"\n").policy).scale == 2.0);
  CHECK(fusion_error("[fusion]\nkind = \"scaled_best\"\nscale = 0\n") ==
        "run.toml: fusion.scale = 0: must be positive");
  CHECK(fusion_error("[fusion]\nkind = \"scaled_best\"\nbeta = 1.0\n") ==
        "run.toml: fusion.beta = 1.0: is not used by fusion.kind = \"scaled_best\"");
  CHECK(fusion_error("[fusion]\nkind = \"path_softmax\"\nscale = 1.0\n") ==
        "run.toml: fusion.scale = 1.0: is not used by fusion.kind = \"path_softmax\"");
  CHECK(fusion_error("[fusion]\nkind = \"best\"\n") ==
        "run.toml: fusion.kind = 'best': must be uniform_mean, path_softmax, split_softmax, max_reward, step_gain or "
        "scaled_best");
  // The built-in entries read as before.
  CHECK(std::get<bg::path_softmax>(read_fusion("[fusion]\nkind = \"path_softmax\"\nbeta = 0.25\n").policy).beta ==
        0.25);
}

TEST_CASE("[advantage] per_reward: the run's normalizer takes each reward part on its own") {
  const bg::rollout_tree tree(bg::split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), bg::numbered_trees(1));
  const std::vector<double> a = {1, 3, 2, 6}, b = {0, 2, 4, 6}, total = {1, 4, 4, 9};
  const std::vector<bg::leaf_component> parts = {{.name = "a", .weight = 1.0, .leaf = a},
                                                 {.name = "b", .weight = 0.5, .leaf = b}};
  bg::run_config separate =
      bg::parse_run_config("[advantage]\nkind = \"per_prompt_running\"\nper_reward = true\n", "run.toml");
  bg::per_reward<bg::any_fusion, bg::any_normalizer> expected{.fusion = separate.recipe.fusion,
                                                              .normalizer = separate.recipe.normalizer.normalizer};
  const bg::reward_view view{.leaf = total, .fused = {}, .components = parts};
  CHECK(separate.recipe.normalizer(tree, view) == expected(tree, view));
  // Its state: one buffer per part, restored into a fresh run's normalizer.
  const bg::component_state state = separate.recipe.normalizer.save_state();
  CHECK(state.at("parts") == std::vector<double>{2});
  CHECK(state.at("part.0.prompt.0") == a);
  bg::run_config resumed =
      bg::parse_run_config("[advantage]\nkind = \"per_prompt_running\"\nper_reward = true\n", "run.toml");
  resumed.recipe.normalizer.load_state(state);
  CHECK(resumed.recipe.normalizer(tree, view) == separate.recipe.normalizer(tree, view));
  CHECK_THAT(bg::config_text(separate), Catch::Matchers::Contains("advantage.per_reward = true"));
  // Off (the default): [advantage] kind on the total, parts ignored.
  bg::run_config plain = bg::parse_run_config("", "run.toml");
  CHECK(!plain.recipe.normalizer.per_reward);
  const std::vector<double> fused = bg::uniform_mean{}(tree, total);
  CHECK(plain.recipe.normalizer(tree, {.leaf = total, .fused = fused, .components = parts}) ==
        bg::depth_wise{}(tree, {.leaf = total, .fused = fused}));
  CHECK(error_of("[advantage]\nper_reward = 1\n").rfind("run.toml: advantage.per_reward", 0) == 0);
}

TEST_CASE("[eval]: held-out evaluation keys, their defaults, their checks and what resume may change") {
  // Off by default, and a config without it writes no eval key (its checkpoints resume as before).
  const bg::run_config plain = bg::parse_run_config("", "run.toml");
  CHECK(!plain.eval.enabled());
  CHECK(bg::config_text(plain, false).find("eval.") == std::string::npos);
  const bg::run_config config = bg::parse_run_config(
      "[rollout]\nsteps = 12\nshift = 2.0\n"
      "[eval]\nembeddings = \"heldout.safetensors\"\nevery = 5\nsamples = 3\nseed = 9\nema = false\n"
      "[[eval.rewards]]\nname = \"alignment\"\nwin_rate = true\n",
      "run.toml");
  CHECK(config.eval.enabled());
  CHECK(config.eval.every == 5);
  CHECK(config.eval.samples == 3);
  CHECK(config.eval.steps == 0);
  CHECK(config.eval.seed == 9);
  CHECK(!config.eval.ema);
  REQUIRE(config.eval_rewards().size() == 1);
  CHECK(config.eval_rewards()[0].win_rate);
  // eval.steps = 0: the rollout's steps and shift.
  CHECK(config.eval_schedule().steps() == 12);
  CHECK(config.eval_schedule().sigma(1) == config.schedule().sigma(1));
  const bg::run_config own_steps =
      bg::parse_run_config("[eval]\nembeddings = \"h.safetensors\"\nsteps = 4\n", "run.toml");
  CHECK(own_steps.eval_schedule().steps() == 4);
  CHECK(own_steps.eval_rewards() == own_steps.rewards);  // no [[eval.rewards]]: the run's
  // The canonical text holds every eval key and round-trips.
  const std::string text = bg::config_text(config, false);
  CHECK_THAT(text,
             Catch::Matchers::Contains("eval.samples = 3\n") && Catch::Matchers::Contains("eval.ema = false\n") &&
                 Catch::Matchers::Contains("eval.rewards = [{ name = \"alignment\", weight = 1.0, win_rate = true"));
  CHECK(bg::parse_run_config(text, "canonical.toml").eval == config.eval);
  CHECK(bg::parse_run_config(bg::config_text(own_steps, false), "canonical.toml").eval == own_steps.eval);
  // When evaluations happen may change on resume; what an evaluation measures may not.
  CHECK(bg::resume_may_change("eval.every"));
  CHECK(bg::resume_may_change("eval.embeddings"));
  CHECK(!bg::resume_may_change("eval.samples"));
  CHECK(!bg::resume_may_change("eval.seed"));
  CHECK(!bg::resume_may_change("input eval.embeddings"));
  // Bad values: one line naming the key.
  CHECK(error_of("[eval]\nembeddings = \"h\"\nevery = 0\n") == "run.toml: eval.every = 0: must be at least 1");
  CHECK(error_of("[eval]\nembeddings = \"h\"\nsamples = 5000\n") ==
        "run.toml: eval.samples = 5000: must be in [1, 4096]");
  CHECK(error_of("[eval]\nevery = 3\n") ==
        "run.toml: eval.every = 3: needs eval.embeddings: the held-out prompts to evaluate on");
  CHECK(error_of("[eval]\nembeddings = \"h\"\nrewards = []\n") ==
        "run.toml: eval.rewards = []: needs at least one [[eval.rewards]] entry, or none for the run's");
  CHECK(error_of("[eval]\nembeddings = \"h\"\n[[eval.rewards]]\nname = \"clip\"\n")
            .rfind("run.toml: eval.rewards[0].name = 'clip': must be ", 0) == 0);
  CHECK(error_of("[eval]\nembeddings = \"h\"\nstepz = 2\n").rfind("run.toml: unknown key eval.stepz", 0) == 0);
}

TEST_CASE("[loss] ratio_norm and step_weight: off by default, read, written only when on, one-line errors") {
  const bg::run_config plain = bg::parse_run_config("", "run.toml");
  CHECK_FALSE(plain.loss.ratio_norm);
  CHECK(plain.loss.step_weight == bg::step_weighting::none);
  CHECK(bg::config_text(plain, false).find("loss.ratio_norm") == std::string::npos);
  CHECK(bg::config_text(plain, false).find("loss.step_weight") == std::string::npos);
  const bg::run_config guard =
      bg::parse_run_config("[loss]\nratio_norm = true\nstep_weight = \"inverse_dt\"\n", "run.toml");
  CHECK(guard.loss == bg::ppo_options{.ratio_norm = true, .step_weight = bg::step_weighting::inverse_dt});
  CHECK(bg::parse_run_config("[loss]\nstep_weight = \"noise_std\"\n", "run.toml").loss.step_weight ==
        bg::step_weighting::noise_std);
  // The canonical text names both and reads back as the same loss.
  for (const std::string_view line : {"loss.ratio_norm = true\n", "loss.step_weight = \"inverse_dt\"\n"})
    CHECK(bg::config_text(guard, false).find(line) != std::string::npos);
  CHECK(bg::parse_run_config(bg::config_text(guard, false), "canonical.toml").loss == guard.loss);
  CHECK(error_of("[loss]\nstep_weight = \"dt\"\n") ==
        "run.toml: loss.step_weight = 'dt': must be none, inverse_dt, noise_std or equal_steps");
  CHECK(error_of("[loss]\nratio_norm = 1\n").rfind("run.toml: loss.ratio_norm = 1: ", 0) == 0);
}

TEST_CASE("[optimizer] sharding: the modes, the bucket size, their one-line errors and what resume may change") {
  // Off by default, and a config without it writes no sharding key (its checkpoints resume as before).
  const bg::run_config plain = bg::parse_run_config("", "run.toml");
  CHECK(plain.sharding == bg::sharding_options{});
  CHECK(bg::config_text(plain, false).find("optimizer.sharding") == std::string::npos);
  CHECK(bg::config_text(plain, false).find("optimizer.bucket_mb") == std::string::npos);
  const bg::run_config zero2 =
      bg::parse_run_config("[optimizer]\nlr = 1e-4\nsharding = \"gradients\"\nbucket_mb = 50\n", "run.toml");
  CHECK(zero2.sharding == bg::sharding_options{.mode = bg::sharding_mode::gradients, .bucket_megabytes = 50});
  CHECK(zero2.optimizer.lr == 1e-4);
  CHECK(bg::parse_run_config("[optimizer]\nsharding = \"optimizer\"\n", "run.toml").sharding.mode ==
        bg::sharding_mode::optimizer);
  // The canonical text holds both keys and round-trips; both may change on resume (the same experiment).
  const std::string text = bg::config_text(zero2, false);
  CHECK_THAT(text, Catch::Matchers::Contains("optimizer.sharding = \"gradients\"\n") &&
                       Catch::Matchers::Contains("optimizer.bucket_mb = 50.0\n"));
  CHECK(bg::parse_run_config(text, "canonical.toml").sharding == zero2.sharding);
  CHECK(bg::resume_may_change("optimizer.sharding"));
  CHECK(bg::resume_may_change("optimizer.bucket_mb"));
  // Bad values: one line each, naming the key and the value.
  CHECK(error_of("[optimizer]\nsharding = \"zero2\"\n") ==
        "run.toml: optimizer.sharding = \"zero2\": must be none, optimizer, gradients or parameters");
  CHECK(error_of("[optimizer]\nsharding = \"parameters\"\n") ==
        "run.toml: optimizer.sharding = \"parameters\": not built in this version; docs/distributed.md gives its "
        "design");
  CHECK(error_of("[optimizer]\nbucket_mb = 0\n") == "run.toml: optimizer.bucket_mb = 0: must be in (0, 65536]");
  CHECK(error_of("[optimizer]\nsharding = 2\n").rfind("run.toml: optimizer.sharding = 2: ", 0) == 0);
}

TEST_CASE("sections are described once: the same rules for a config and for C++, resume keys from the flags") {
  // A section built in C++ is checked by the rules its TOML is read with (core/parameters.hpp).
  CHECK_THROWS_WITH(bg::validate_parameters(bg::model_section{.dtype = "half"}, "model"),
                    "model.dtype = \"half\": must be float32, bfloat16 or float16");
  CHECK(error_of("[model]\nconfig = \"pro\"\n") ==
        "run.toml: model.config = 'pro': must be \"\", dev, schnell, tiny, wan-t2v-1.3b, wan-t2v-14b, wan-tiny, "
        "sd3.5-medium, sd3.5-large, "
        "sd3-tiny, wan2.2-t2v-a14b or wan22-tiny");
  CHECK(error_of("[model]\ndtype = \"half\"\n") ==
        "run.toml: model.dtype = 'half': must be float32, bfloat16 or float16");
  CHECK_THROWS_WITH(bg::validate_parameters(bg::lora_section{.targets = {"attn"}}, "lora"),
                    "lora.targets = [\"attn\"]: unknown target \"attn\" (attention, mlp, modulation or embedding)");
  CHECK_THROWS_WITH(bg::validate(bg::ppo_options{.advantage_clip = 0}),
                    "loss.advantage_clip = 0.0: must be in [0.001, 1000]");
  CHECK(error_of("[loss]\nadvantage_clip = 0\n") == "run.toml: loss.advantage_clip = 0: must be in [0.001, 1000]");
  // What resume may change is what the descriptions flag: these 17 keys (config_text.hpp's file comment).
  const std::vector<std::string> resumable = {"model.dir",
                                              "model.weights",
                                              "model.decoder",
                                              "model.device",
                                              "model.gradient_checkpointing",
                                              "data.embeddings",
                                              "rollout.max_batch",
                                              "rollout.decode_batch",
                                              "run.iterations",
                                              "run.output_dir",
                                              "run.grid_every",
                                              "run.checkpoint_every",
                                              "run.keep_checkpoints",
                                              "eval.embeddings",
                                              "eval.every",
                                              "optimizer.sharding",
                                              "optimizer.bucket_mb"};
  CHECK(bg::config_text_detail::resumable() == resumable);
  for (const std::string& key : resumable) CHECK(bg::resume_may_change(key));
  CHECK(!bg::resume_may_change("model.dtype"));
  CHECK(!bg::resume_may_change("lora.rank"));
  // A key written only where its description says so: model.weights beside model.dir never, eval.* only when on.
  const std::string text = bg::config_text(bg::run_config{}, false);
  CHECK(text.find("model.weights") == std::string::npos);
  CHECK(text.find("eval.") == std::string::npos);
  bg::run_config without_dir;
  without_dir.model.dir = "";
  CHECK(bg::config_text(without_dir, false).find("model.weights = \"\"\n") != std::string::npos);
}
