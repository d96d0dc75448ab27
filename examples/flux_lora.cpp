// BranchGRPO on a FLUX-architecture transformer with LoRA, through the LibTorch adapter (adapters/torch,
// target branchgrpo::torch): one training iteration of the shipped tiny model models/shapes-tiny (16 x 16
// pixels, prompts like "a red circle"), assembled from the library's pieces instead of a run config:
//   flux_denoiser   the transformer as a Denoiser, conditioned on each row's prompt embedding
//   autograd_policy the Policy the trainer updates (log-probs with autograd, AdamW over the trainable tensors)
//   torch_backend   the Backend: latents as torch tensors [rows, 3, 16, 16]
//   shape_alignment the Reward: colour and shape of the image against its prompt, in [0, 1]
// and the same train_iteration and recipe as the toy examples. It checks that LoRA confines the update to the
// adapters: every base weight is bit-identical afterwards.
// Run: build/examples/example_flux_lora models/shapes-tiny   (exit status 1 when a checked fact does not hold)
#include <branchgrpo/app/rewards.hpp>
#include <branchgrpo/app/shapes.hpp>
#include <branchgrpo/branchgrpo.hpp>
#include <branchgrpo/torch/backend.hpp>
#include <branchgrpo/torch/flux/denoiser.hpp>
#include <branchgrpo/torch/lora.hpp>
#include <branchgrpo/torch/policy.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <vector>

int main(int argc, char** argv) try {
  namespace bg = branchgrpo;
  if (argc != 2) {
    std::cerr << "usage: example_flux_lora MODEL_DIR   (e.g. models/shapes-tiny)\n";
    return 2;
  }
  const bg::shapes_model model = bg::load_shapes_model(argv[1]);  // weights, config, prompt embeddings
  const auto transformer = bg::make_shapes_transformer(model);
  // Rank-8 adapters on the attention and MLP layers; add_lora freezes every other parameter. B starts at 0,
  // so the adapted model starts as the base model exactly.
  const std::int64_t adapted = bg::add_lora(*transformer, {.rank = 8, .alpha = 8, .seed = 0});
  std::map<std::string, torch::Tensor> before;
  for (const auto& p : transformer->named_parameters()) before[p.key()] = p.value().detach().clone();

  bg::flux_denoiser denoiser(transformer, model.embeddings);
  bg::torch_backend backend{.device = torch::kCPU, .dtype = torch::kFloat32};
  // lr 1e-3 suits LoRA on a tiny model (FLUX-size models want ~1e-5); no weight decay, so a tensor with a zero
  // gradient stays exactly where it was.
  bg::autograd_policy policy(denoiser, backend, {.optimizer = {.lr = 1e-3, .weight_decay = 0.0}});
  bg::shape_alignment reward{.prompts = model.prompts};

  auto recipe = bg::branch_method(bg::parent_top_k{.k = 1});  // BranchGRPO-WidPru, as for the toy
  const std::vector<std::int64_t> prompts = {0, 4};           // one dense tree per prompt
  // Two optimizer steps: at the first, B = 0 makes A's gradient zero, so only the second moves A.
  const bg::iteration_stats s = bg::train_iteration(
      backend, policy, reward, recipe, bg::shifted_linear_schedule(20), bg::latent_shape{{3, 16, 16}}, prompts, 0,
      {.max_batch = 64, .seed = 0, .updates_per_iteration = 2, .total_iterations = 1});

  int lora_changed = 0, lora_total = 0, base_changed = 0, base_total = 0;
  for (const auto& p : transformer->named_parameters()) {
    const bool lora = p.key().find(".lora_") != std::string::npos;
    const bool changed = !torch::equal(before.at(p.key()), p.value().detach());
    (lora ? lora_total : base_total) += 1;
    (lora ? lora_changed : base_changed) += changed ? 1 : 0;
  }
  std::cout << "prompts '" << model.prompts[0] << "', '" << model.prompts[4] << "': " << s.rollout_evaluations
            << " evaluations, mean reward " << s.reward_mean << ", " << s.edges_trained << " of " << s.edges
            << " edges trained, " << s.seconds << " s\n"
            << adapted << " adapted layers: " << lora_changed << " of " << lora_total << " LoRA tensors changed, "
            << base_changed << " of " << base_total << " base tensors changed\n";

  bool ok = true;
  const auto check = [&ok](bool fact, const char* what) {
    if (!fact) std::cerr << "FAILED: " << what << '\n';
    ok = ok && fact;
  };
  check(s.rollout_evaluations == 406, "two dense trees cost 406 evaluations");
  check(s.trees_dropped == 0 && s.edges_trained > 0, "both trees were trained");
  check(lora_changed == lora_total, "every LoRA tensor changed");
  check(base_changed == 0, "no base weight changed");
  return ok ? 0 : 1;
} catch (const std::exception& error) {
  std::cerr << "error: " << error.what() << '\n';
  return 1;
}
