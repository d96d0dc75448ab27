// The c10d communicator (branchgrpo/torch/distributed.hpp) as N real processes: run_ranks.sh starts this program
// once per rank with torchrun's variables set by hand; `test_distributed SCENARIO [TIMEOUT_SECONDS]`.
//
//   collectives      all_reduce_sum of doubles and tensors, all_gather of bytes, barrier, the consistency checks
//                    (also their mismatch, caught on every rank); any number of ranks; prints "rank R: ok"
//   rank1_exits      rank 1 exits after collective 1; rank 0 must fail collective 2 naming rank 1
//   rank1_hangs      rank 1 sleeps after collective 1; rank 0 must fail within the timeout naming rank 1
//   rank0_exits      rank 0 (the store's host) exits after collective 1; rank 1 must fail naming rank 0
//   rank1_absent     rank 1 never joins; rank 0 must fail the rendezvous naming rank 1
//   config_mismatch  the ranks hash different configs: every rank must fail with the mismatch line
//   size_mismatch    the ranks all-reduce different sizes: every rank must fail, blaming none
//   toy              every rank trains the toy policy (host backend) through the c10d communicator for 3
//                    iterations; rank 0 also trains alone and compares: parameters within 1e-9 (relative), equal
//                    on every rank; prints "rank 0: toy: max relative difference X"
//   zero             the autograd policy sharded (ZeRO-1 "optimizer", ZeRO-2 "gradients", bucket 0.0001 MB: 25
//                    floats, so buckets straddle tensors and ranks), 3 updates of a tiny full fine-tuning model and of
//                    a tiny LoRA model, each rank accumulating its rows: rank 0 also trains the unsharded policy alone
//                    on every rank's rows and compares (max relative parameter difference < 1e-6 on 2 ranks, 1e-5
//                    on 3, gradient norms within 1e-6); the sharded ranks end bit-identical; AdamW's state on a rank is
//                    its share (ceil(total / size) elements a moment, against total alone); the EMA too; ZeRO-2 with
//                    rank r accumulating in r + 1 batches and padding (pad_accumulate) ends where one process ends.
//                    Prints "rank
//                    0: zero: <mode> <model>: max relative difference X, optimizer state A -> B elements"
//                    Then checkpoints across world sizes (policy_state.hpp): the state gathered after 2 sharded
//                    updates equals the unsharded one's, and resuming it in one unsharded process (N -> 1), or one
//                    process's state sharded (1 -> N), takes update 3 to where 3 unsharded updates end.
//                    Then sharded checkpoints: every rank writes its shard (write_sharded_checkpoint); assembled they
//                    equal the gathered state bit for bit, every range of 1-3 ranks reads back its slice, each rank's
//                    own range resumes update 3, and a flipped byte or a missing shard 1 is named
//   zero_one         one process: the sharded policy with one rank is bit for bit the unsharded one (float32 and
//                    bfloat16 models, with EMA), and the bad sharding options are one line each
//   join             joins from the environment and leaves (the environment errors, one line)
//   exposure         rank 0 checks, after the join on MASTER_ADDR=127.0.0.1, that every socket it listens on (the
//                    store's, Gloo's) accepts only this host: bound to a loopback address or to the loopback
//                    interface, read back from /proc/net/tcp{,6} (exposure.hpp), and that the store refuses
//                    connections through every other address of this host while accepting 127.0.0.1
//   compare A B TOL  one process: the tensors of two safetensors files (or checkpoint directories: their trainable
//                    weights, a sharded one's assembled) agree within the relative tolerance TOL
//                    (||a - b|| / ||a|| over all of them); prints "compare: N tensors, relative difference X ..."
//   verify DIR       one process: exits 0 when checkpoint DIR verifies (verify_checkpoint), else prints why, exits 1
//   environment      one process: read_launch_environment's checks over made-up environments
//
// An expected failure prints "rank R: <message>" (one line) on stderr and exits 1; a failed check prints
// "FAILED: ..." and exits 2; an error of several lines exits 3; one later than the timeout (+1 s) after the join
// (or the start, for a failed join) exits 4.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/torch/distributed.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "branchgrpo/torch/policy_state.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/toy.hpp"
#include "exposure.hpp"

namespace {

namespace bg = branchgrpo;

// Where the timeout starts: the program's start, then the end of the join (a collective's timeout runs from it).
std::chrono::steady_clock::time_point phase_start = std::chrono::steady_clock::now();

struct check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect(bool condition, const std::string& what) {
  if (!condition) throw check_failed(what);
}

// The error `run` throws, or "" when it throws none.
template <class Run>
std::string error_of(Run&& run) {
  try {
    run();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

void collectives(bg::c10d_communicator& comm) {
  static_assert(bg::Communicator<bg::c10d_communicator>);
  const int rank = comm.rank(), size = comm.size();
  const double ranks_sum = size * (size + 1) / 2.0;  // sum of rank + 1 over the ranks

  std::vector<double> values{rank + 1.0, 0.5, -2.0 * rank};
  comm.all_reduce_sum(values);
  expect(values == std::vector<double>{ranks_sum, 0.5 * size, -1.0 * size * (size - 1)}, "all_reduce_sum doubles");
  std::vector<double> none;
  comm.all_reduce_sum(none);

  // Gradients: two dtypes, non-contiguous and scalar tensors, reduced in place.
  std::vector<torch::Tensor> tensors{torch::full({2, 3}, rank + 1.0, torch::kFloat32),
                                     torch::full({4}, 10.0 * (rank + 1), torch::kFloat64),
                                     torch::full({3, 2}, rank + 1.0, torch::kFloat32).t(), torch::tensor(1.0f)};
  const void* storage = tensors[0].data_ptr();
  comm.all_reduce_sum(tensors);
  expect(tensors[0].data_ptr() == storage, "all_reduce_sum tensors in place");
  expect(torch::equal(tensors[0], torch::full({2, 3}, ranks_sum, torch::kFloat32)), "all_reduce_sum float32");
  expect(torch::equal(tensors[1], torch::full({4}, 10 * ranks_sum, torch::kFloat64)), "all_reduce_sum float64");
  expect(torch::equal(tensors[2], torch::full({2, 3}, ranks_sum, torch::kFloat32)), "all_reduce_sum transposed");
  expect(tensors[3].item<float>() == static_cast<float>(size), "all_reduce_sum scalar");
  std::vector<torch::Tensor> one{torch::arange(5, torch::kFloat32) * (rank + 1)};
  comm.all_reduce_sum(one);
  expect(torch::equal(one[0], torch::arange(5, torch::kFloat32) * ranks_sum), "all_reduce_sum one tensor");

  const std::string local = "rank" + std::to_string(rank);  // equal sizes for ranks 0-9
  std::vector<std::byte> gathered(local.size() * static_cast<std::size_t>(size));
  comm.all_gather(std::as_bytes(std::span(local)), gathered);
  std::string expected;
  for (int r = 0; r < size; ++r) expected += "rank" + std::to_string(r);
  expect(std::string(reinterpret_cast<const char*>(gathered.data()), gathered.size()) == expected, "all_gather");
  const std::int64_t mine[2] = {rank, -rank};
  const std::vector<std::int64_t> values64 = bg::all_gather_values<std::int64_t>(comm, mine);
  for (int r = 0; r < size; ++r)
    expect(values64[2 * static_cast<std::size_t>(r)] == r && values64[2 * static_cast<std::size_t>(r) + 1] == -r,
           "all_gather_values");
  expect(error_of([&] {
           comm.all_gather(std::as_bytes(std::span(local)), std::span(gathered).first(1));
         }).find("all_gather: 1 bytes for") == 0,
         "all_gather size check");

  comm.barrier();

  // Consistency: equal hashes pass; different ones throw the same line on every rank, and the group goes on.
  bg::check_same_everywhere(comm, bg::xxh64_digest("the same config"), "configs");
  const std::vector<torch::Tensor> parameters{torch::ones({3}), torch::zeros({2, 2}, torch::kFloat64)};
  bg::check_same_parameters(comm, std::span<const torch::Tensor>(parameters));
  const std::vector<torch::Tensor> drifted{torch::ones({3}) * (rank == size - 1 ? 2 : 1)};
  const std::string mismatch = error_of([&] { bg::check_same_parameters(comm, std::span(drifted)); });
  const std::string last = size == 2 ? "rank 1" : size == 3 ? "rank 2" : "rank " + std::to_string(size - 1);
  const std::string first = size == 2 ? "rank 0" : "ranks 0-" + std::to_string(size - 2);
  expect(mismatch.starts_with("the ranks run different parameters: " + first + " xxh64 ") &&
             mismatch.find(", " + last + " xxh64 ") != std::string::npos,
         "parameter mismatch: " + mismatch);
  comm.barrier();
  expect(comm.collectives() == 12, "12 collectives, got " + std::to_string(comm.collectives()));
}

// The `exposure` scenario's checks on rank 0 (see the header comment).
void check_exposure(int store_port) {
  const std::string loopback = exposure::loopback_interface();
  bool store_found = false;
  for (const exposure::listener& l : exposure::own_listeners()) {
    const std::string where =
        l.address + " port " + std::to_string(l.port) + (l.device.empty() ? "" : " on interface " + l.device);
    store_found = store_found || l.port == store_port;
    std::cout << "rank 0: listens on " << where << (l.port == store_port ? " (the store)" : "") << '\n';
    expect(l.loopback || l.device == loopback, "rank 0 listens on " + where + ": other hosts can connect");
  }
  expect(store_found, "no socket of rank 0 listens on MASTER_PORT " + std::to_string(store_port));
  expect(exposure::connects("127.0.0.1", store_port), "the store refuses a connection to 127.0.0.1");
  const std::vector<std::string> others = exposure::host_addresses();
  for (const std::string& address : others)
    expect(!exposure::connects(address, store_port),
           "the store accepts a connection at " + address + " port " + std::to_string(store_port));
  std::cout << "rank 0: the store refuses this host's " << others.size() << " other addresses\n";
}

int environment_checks() {
  using environment = std::map<std::string, std::string>;
  const auto read = [](const environment& variables) {
    return bg::read_launch_environment([&](const char* name) -> const char* {
      const auto found = variables.find(name);
      return found == variables.end() ? nullptr : found->second.c_str();
    });
  };
  const auto error = [&](const environment& variables) { return error_of([&] { (void)read(variables); }); };
  const environment good{{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};

  expect(!read({}).has_value(), "no WORLD_SIZE: one process");
  const auto e = read(good);
  expect(e && e->rank == 1 && e->world_size == 2 && e->local_rank == 1 && e->local_world_size == 2 &&
             e->master_addr == "127.0.0.1" && e->master_port == 29500 && !e->agent_store && e->restart_count == 0,
         "a good environment");
  environment torchrun = good;
  torchrun.insert({{"LOCAL_RANK", "0"},
                   {"LOCAL_WORLD_SIZE", "1"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const auto t = read(torchrun);
  expect(t && t->local_rank == 0 && t->local_world_size == 1 && t->agent_store && t->restart_count == 2, "torchrun");

  const auto with = [&](const std::string& name, const std::string& value) {
    environment changed = good;
    changed[name] = value;
    return error(changed);
  };
  const auto without = [&](const std::string& name) {
    environment changed = good;
    changed.erase(name);
    return error(changed);
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {with("RANK", "x"), "RANK = x: must be an integer in [0, 1]"},
      {with("RANK", "2"), "RANK = 2: must be an integer in [0, 1]"},
      {with("WORLD_SIZE", "0"), "WORLD_SIZE = 0: must be an integer in [1, 1048576]"},
      {with("WORLD_SIZE", ""), "WORLD_SIZE = : must be an integer in [1, 1048576]"},
      {with("MASTER_PORT", "70000"), "MASTER_PORT = 70000: must be an integer in [1, 65535]"},
      {with("LOCAL_RANK", "-1"), "LOCAL_RANK = -1: must be an integer in [0, 1]"},
      {with("LOCAL_WORLD_SIZE", "3"), "LOCAL_WORLD_SIZE = 3: must be an integer in [1, 2]"},
      {with("MASTER_ADDR", ""), "MASTER_ADDR = '': must be a host name or address"},
      {with("TORCHELASTIC_RESTART_COUNT", "one"),
       "TORCHELASTIC_RESTART_COUNT = one: must be an integer in [0, 1073741824]"},
      {without("RANK"),
       "RANK is not set (WORLD_SIZE is: a multi-process launch needs RANK, MASTER_ADDR and "
       "MASTER_PORT too)"},
      {without("MASTER_ADDR"),
       "MASTER_ADDR is not set (WORLD_SIZE is: a multi-process launch needs RANK, "
       "MASTER_ADDR and MASTER_PORT too)"},
      {without("MASTER_PORT"),
       "MASTER_PORT is not set (WORLD_SIZE is: a multi-process launch needs RANK, "
       "MASTER_ADDR and MASTER_PORT too)"},
  };
  for (const auto& [got, want] : cases) expect(got == want, "environment error '" + got + "', expected '" + want + "'");

  const bg::launch_environment one{.master_addr = "127.0.0.1", .master_port = 1};
  expect(error_of([&] { bg::c10d_communicator c(one, {.timeout_seconds = 0.5}); }) ==
             "distributed timeout_seconds = 0.5: must be in [1, 86400]",
         "timeout range");
  std::cout << "environment: ok\n";
  return 0;
}

// The toy (fourier policy, host backend) trained for 3 iterations of the branch method with the stateful
// per-prompt normalizer and two optimizer steps per iteration, through `communicator`.
template <class Comm>
std::vector<double> train_toy(Comm& communicator) {
  auto policy = bg::make_toy_policy(7);
  bg::mode_reward<> reward;
  bg::host_backend backend;
  const auto schedule = bg::shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts = {0, 1, 2, 3, 0};
  bg::with_method("branch-widpru", [&](auto recipe) {
    auto running = bg::method{recipe.topology, recipe.stepper,           recipe.correlator,
                              recipe.fusion,   bg::per_prompt_running{}, recipe.pruner};
    for (int i = 0; i < 3; ++i)
      (void)bg::train_iteration(
          backend, policy, reward, running, schedule, bg::toy_latent_shape(), prompts, i,
          bg::training_options{.max_batch = 16, .seed = 11, .updates_per_iteration = 2, .total_iterations = 3},
          communicator);
    return 0;
  });
  return {policy.parameters().begin(), policy.parameters().end()};
}

// A tiny velocity model: v(x) = tanh(x W1 + b1) W2 (full fine-tuning: W1, b1, W2 trainable; 3 * 7 + 7 + 7 * 3 =
// 49 elements: 2 ranks split b1, 3 ranks W1 and W2) or v(x) = x W + x A B (LoRA: W frozen, A [3, 2] and
// B [2, 3] trainable, B = 0 at the start).
struct tiny_model {
  bool lora = false;
  bool permuted = false;  // full model: trainable order {w2, w1, b1}, so the backward pass's order (w2, b1, w1) is
                          // not the reverse one: ZeRO-2 learns it (a reduction order across the flat buffer)
  torch::Tensor w1, b1, w2, frozen, a, b;

  explicit tiny_model(bool lora_model, torch::Dtype dtype = torch::kFloat32, bool permuted_order = false)
      : lora(lora_model), permuted(permuted_order) {
    torch::manual_seed(3);
    const auto make = [&](std::vector<std::int64_t> shape, double scale, bool trainable) {
      return (torch::randn(shape, torch::kFloat64) * scale).to(dtype).set_requires_grad(trainable);
    };
    if (lora) {
      frozen = make({3, 3}, 0.5, false);
      a = make({3, 2}, 0.5, true);
      b = torch::zeros({2, 3}, torch::TensorOptions().dtype(dtype)).set_requires_grad(true);
    } else {
      w1 = make({3, 7}, 0.5, true);
      b1 = make({7}, 0.1, true);
      w2 = make({7, 3}, 0.5, true);
    }
  }
  torch::Tensor velocity(const torch::Tensor& x, const bg::denoise_batch&) {
    const torch::Tensor h = x.to(lora ? frozen.scalar_type() : w1.scalar_type());
    return lora ? h.matmul(frozen) + h.matmul(a).matmul(b) : torch::tanh(h.matmul(w1) + b1).matmul(w2);
  }
  std::vector<torch::Tensor> trainable_parameters() {
    if (lora) return {a, b};
    return permuted ? std::vector{w2, w1, b1} : std::vector{w1, b1, w2};
  }
};

// Iteration t's edges: 10 rows of latent [3]; `share` picks the rows a rank accumulates.
bg::edge_batch<torch::Tensor> tiny_edges(int t, bg::tree_share share, std::vector<std::int64_t>& prompts,
                                         std::vector<std::uint32_t>& trees) {
  torch::manual_seed(100 + t);
  const torch::Tensor x = torch::randn({10, 3}), next = torch::randn({10, 3});
  const auto rows = share.count();
  prompts.assign(static_cast<std::size_t>(rows), 0);
  trees.assign(static_cast<std::size_t>(rows), 0);
  return {.step = t,
          .sigma = 0.5,
          .coeffs = {.x_coeff = 1.0, .velocity_coeff = -0.1, .noise_std = 0.3},
          .x = x.narrow(0, share.first, rows),
          .next = next.narrow(0, share.first, rows),
          .std = std::vector<double>(static_cast<std::size_t>(rows), 0.3),
          .trees = trees,
          .prompts = prompts};
}

// Row r of iteration t weighs (r + t) mod 5 - 2: some rows pushed up, some down.
bg::loss_gradient_fn tiny_weights(int t, std::int64_t first) {
  return [t, first](std::span<const double> log_probs) {
    std::vector<double> w;
    for (std::size_t r = 0; r < log_probs.size(); ++r)
      w.push_back(static_cast<double>((static_cast<std::int64_t>(r) + first + t) % 5) - 2.0);
    return w;
  };
}

struct tiny_run {
  std::vector<torch::Tensor> parameters;  // float64 copies
  std::vector<torch::Tensor> ema;         // the EMA's tensors as the policy holds them (a shard's pieces, sharded)
  std::vector<double> norms;
  std::int64_t state_elements = 0;
  bg::policy_state state;  // policy_state_tensors at the end (a collective when sharded)
};

// Which updates a tiny run takes, and from which state (a checkpoint's tensors; none: the model's start).
struct tiny_span {
  int first = 0, last = 3;
  const bg::policy_state* start = nullptr;
  const bg::checkpoint_range* start_range = nullptr;  // a sharded checkpoint's range for this rank
  bool uneven = false;    // rank r accumulates its rows in r + 1 batches and pads to the most (pad_accumulate)
  bool permuted = false;  // tiny_model::permuted
  std::filesystem::path write_to = {};  // sharded: write a sharded checkpoint there at the end
};

const std::vector<std::string> tiny_names(bool lora) {
  return lora ? std::vector<std::string>{"a", "b"} : std::vector<std::string>{"w1", "b1", "w2"};
}

// Updates [first, last) with lr 1e-2 (clipping at 0.5: it binds) and an EMA, as rank `rank` of `size` (rank 0 of 1
// with single_process: every row, in batch_ranks batches).
template <class Comm>
tiny_run train_tiny(Comm& communicator, bool lora, bg::sharding_options sharding, int batch_ranks,
                    torch::Dtype dtype = torch::kFloat32, tiny_span span = {}) {
  tiny_model model(lora, dtype, span.permuted);
  const bg::autograd_policy_options options{
      .optimizer = {.lr = 1e-2, .weight_decay = 1e-2, .max_grad_norm = 0.5, .ema_decay = 0.9}, .sharding = sharding};
  bg::autograd_policy policy(model, bg::torch_backend{}, options, communicator);
  if (span.start != nullptr) bg::load_policy_state(policy, tiny_names(lora), span.start->weights, span.start->state);
  if (span.start_range != nullptr) bg::load_policy_shard(policy, tiny_names(lora), *span.start_range);
  tiny_run out;
  for (int t = span.first; t < span.last; ++t) {
    // One batch per rank's share of the rows; one process takes every share as a batch of its own, in rank order,
    // so that its gradient sum adds what the ranks' all-reduce adds.
    const bool alone = communicator.size() == 1;
    for (int r = alone ? 0 : communicator.rank(); r < (alone ? batch_ranks : communicator.rank() + 1); ++r) {
      const bg::tree_share part = bg::tree_share::of(10, r, alone ? batch_ranks : communicator.size());
      if (part.count() == 0) continue;
      std::vector<std::int64_t> prompts;
      std::vector<std::uint32_t> trees;
      if (!span.uneven || alone) {
        (void)policy.accumulate(tiny_edges(t, part, prompts, trees), tiny_weights(t, part.first));
        continue;
      }
      // r + 1 batches of rank r's rows (tree_share over its share), then pads up to size calls: what
      // train_iteration does for a rank with fewer edges than another.
      const bg::tree_share rows = bg::tree_share::of(part.count(), 0, 1);
      for (int b = 0; b <= r; ++b) {
        const bg::tree_share piece = bg::tree_share::of(rows.count(), b, r + 1);
        const bg::tree_share batch{.first = part.first + piece.first, .last = part.first + piece.last};
        if (batch.count() == 0) {
          policy.pad_accumulate();
          continue;
        }
        (void)policy.accumulate(tiny_edges(t, batch, prompts, trees), tiny_weights(t, batch.first));
      }
      for (int pad = r + 1; pad < communicator.size(); ++pad) policy.pad_accumulate();
    }
    if (communicator.size() > 1) policy.all_reduce_gradients(communicator);
    out.norms.push_back(policy.apply_update().grad_norm);
  }
  for (const torch::Tensor& p : policy.parameters()) out.parameters.push_back(p.detach().to(torch::kFloat64).clone());
  for (const torch::Tensor& e : policy.ema_parameters()) out.ema.push_back(e.detach().clone());
  out.state_elements = policy.optimizer_state_elements();
  out.state = bg::policy_state_tensors(policy, tiny_names(lora));
  if (!span.write_to.empty()) {
    const bg::checkpoint_layout layout = bg::policy_layout(policy, tiny_names(lora));
    bg::checkpoint_contents common{.iteration = span.last, .seed = 1, .weights = {}, .state = {}};
    common.ranks = communicator.size();
    bg::write_sharded_checkpoint(span.write_to, common, layout, bg::policy_shard_tensors(policy, layout), communicator);
  }
  return out;
}

// max over elements of |a - b| / max(|b|, 1e-3): a weight near 0 is compared at the scale of 1e-3.
double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  expect(a.size() == b.size(), "different tensor counts");
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, ((a[i] - b[i]).abs() / b[i].abs().clamp_min(1e-3)).max().item<double>());
  return worst;
}

bool bit_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i].reshape({-1}), b[i].reshape({-1}))) return false;
  return true;
}

void sharded_training(bg::c10d_communicator& comm) {
  for (const bool lora : {false, true})
    for (const bg::sharding_mode mode : {bg::sharding_mode::optimizer, bg::sharding_mode::gradients}) {
      const std::string what = std::string(bg::sharding_name(mode)) + (lora ? " lora" : " full");
      const tiny_run mine = train_tiny(comm, lora, {.mode = mode, .bucket_megabytes = 1e-4}, comm.size());
      std::vector<torch::Tensor> flat{torch::cat([&] {
        std::vector<torch::Tensor> parts;
        for (const torch::Tensor& p : mine.parameters) parts.push_back(p.reshape({-1}));
        return parts;
      }())};
      bg::check_same_parameters(comm, flat);  // every rank holds the same gathered weights
      const std::int64_t total = lora ? 12 : 49;
      const std::int64_t chunk = (total + comm.size() - 1) / comm.size();
      const std::int64_t mine_count = std::min(total, chunk * (comm.rank() + 1)) - std::min(total, chunk * comm.rank());
      expect(mine.state_elements == 2 * mine_count, what + ": AdamW holds " + std::to_string(mine.state_elements) +
                                                        " elements, expected " + std::to_string(2 * mine_count));
      if (comm.rank() != 0) continue;
      bg::single_process one;
      const tiny_run alone = train_tiny(one, lora, {}, comm.size());
      const double worst = max_relative_difference(mine.parameters, alone.parameters);
      std::cout << "rank 0: zero: " << what << ": max relative difference " << worst << ", optimizer state "
                << alone.state_elements << " -> " << mine.state_elements << " elements\n";
      // 2 ranks add the two shares' gradients as one process adds its two batches (0 difference measured); 3 ranks
      // add three in Gloo's ring order, which rounds differently (8.4e-7 measured), and Adam normalizes that up.
      const double tolerance = comm.size() == 2 ? 1e-6 : 1e-5;
      expect(worst < tolerance, what + ": parameters differ from one process's by " + std::to_string(worst));
      expect(alone.state_elements == 2 * total, what + ": the unsharded AdamW holds every element twice");
      for (std::size_t t = 0; t < alone.norms.size(); ++t)
        expect(std::abs(mine.norms[t] - alone.norms[t]) <= 1e-6 * alone.norms[t],
               what + ": gradient norm of update " + std::to_string(t) + " differs");
      // The EMA shard: rank 0's range is the unsharded EMA's first elements.
      torch::Tensor ema_flat = torch::cat([&] {
        std::vector<torch::Tensor> parts;
        for (const torch::Tensor& e : alone.ema) parts.push_back(e.reshape({-1}).to(torch::kFloat64));
        return parts;
      }());
      torch::Tensor shard_flat = torch::cat([&] {
        std::vector<torch::Tensor> parts;
        for (const torch::Tensor& e : mine.ema) parts.push_back(e.reshape({-1}).to(torch::kFloat64));
        return parts;
      }());
      expect(shard_flat.numel() == mine_count, what + ": the EMA holds more than the shard");
      const double ema_worst = max_relative_difference({shard_flat}, {ema_flat.narrow(0, 0, mine_count)});
      expect(ema_worst < 1e-6, what + ": the EMA shard differs by " + std::to_string(ema_worst));
    }
  // ZeRO-2 reduces during each backward pass, a collective per bucket: ranks with different numbers of batches
  // (rank r: r + 1) pad to the most with pad_accumulate and end where one process ends; with the full model's
  // tensors in an order the backward pass does not follow, after update 1 the buckets follow the learned order.
  for (const bool lora : {false, true}) {
    const std::string what = std::string("gradients uneven") + (lora ? " lora" : " full permuted");
    const tiny_run mine = train_tiny(comm, lora, {.mode = bg::sharding_mode::gradients, .bucket_megabytes = 1e-4},
                                     comm.size(), torch::kFloat32, {.uneven = true, .permuted = !lora});
    bg::single_process alone_group;
    const tiny_run alone =
        train_tiny(alone_group, lora, {}, comm.size(), torch::kFloat32, {.uneven = false, .permuted = !lora});
    const double worst = max_relative_difference(mine.parameters, alone.parameters);
    if (comm.rank() == 0) std::cout << "rank 0: zero: " << what << ": max relative difference " << worst << "\n";
    expect(worst < 1e-5, what + ": parameters differ from one process's by " + std::to_string(worst));
  }
  // Checkpoints across world sizes and sharding (policy_state.hpp): the gathered state after 2 updates is the
  // unsharded one's (same names, moments and EMA within 1e-6, same step); a sharded run's state resumed by one
  // unsharded process, and one process's state resumed sharded, take update 3 to where 3 unsharded updates end.
  bg::single_process one;
  const double tolerance = comm.size() == 2 ? 1e-6 : 1e-5;
  for (const bool lora : {false, true})
    for (const bg::sharding_mode mode : {bg::sharding_mode::optimizer, bg::sharding_mode::gradients}) {
      const std::string what = std::string(bg::sharding_name(mode)) + (lora ? " lora" : " full");
      const bg::sharding_options sharding{.mode = mode, .bucket_megabytes = 1e-4};
      const tiny_run sharded = train_tiny(comm, lora, sharding, comm.size(), torch::kFloat32, {.first = 0, .last = 2});
      const tiny_run plain = train_tiny(one, lora, {}, comm.size(), torch::kFloat32, {.first = 0, .last = 2});
      expect(sharded.state.state.size() == plain.state.state.size(), what + ": the gathered state has other names");
      for (const auto& [name, tensor] : plain.state.state) {
        expect(sharded.state.state.contains(name), what + ": the gathered state lacks " + name);
        const double worst =
            max_relative_difference({sharded.state.state.at(name).to(torch::kFloat64)}, {tensor.to(torch::kFloat64)});
        expect(worst < tolerance, what + ": gathered " + name + " differs by " + std::to_string(worst));
      }
      const tiny_run resumed_sharded = train_tiny(comm, lora, sharding, comm.size(), torch::kFloat32,
                                                  {.first = 2, .last = 3, .start = &plain.state});
      const tiny_run straight = train_tiny(one, lora, {}, comm.size());
      const double into_sharded = max_relative_difference(resumed_sharded.parameters, straight.parameters);
      expect(into_sharded < tolerance,
             what + ": 1 -> " + std::to_string(comm.size()) + " resume differs by " + std::to_string(into_sharded));
      if (comm.rank() != 0) continue;
      const tiny_run resumed_alone =
          train_tiny(one, lora, {}, comm.size(), torch::kFloat32, {.first = 2, .last = 3, .start = &sharded.state});
      const double into_one = max_relative_difference(resumed_alone.parameters, straight.parameters);
      std::cout << "rank 0: zero: " << what << ": resume " << comm.size() << " -> 1 max relative difference "
                << into_one << ", 1 -> " << comm.size() << " " << into_sharded << "\n";
      expect(into_one < tolerance,
             what + ": " + std::to_string(comm.size()) + " -> 1 resume differs by " + std::to_string(into_one));
    }
}

// The flat concatenation of full tensors in order.
torch::Tensor flat_of(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& t : tensors) parts.push_back(t.reshape({-1}).to(torch::kFloat64));
  return torch::cat(parts);
}

// Sharded checkpoints (checkpoint.hpp, write_sharded_checkpoint): after 2 sharded updates every rank writes its
// shard. The assembled checkpoint equals the gathered state bit for bit; every range of every world size 1-3 reads
// back the matching slice; a resume of each rank's own range takes update 3 to where 3 unsharded updates end; a
// flipped byte in shard 1 and a missing shard 1 are each named by the verification.
void sharded_checkpoints(bg::c10d_communicator& comm) {
  bg::single_process one;
  const std::string port = std::getenv("MASTER_PORT") != nullptr ? std::getenv("MASTER_PORT") : "0";
  const std::filesystem::path root = std::filesystem::temp_directory_path() / ("branchgrpo-zero-" + port);
  const std::string shard_1 = "shard-00001-of-0000" + std::to_string(comm.size()) + ".safetensors";
  for (const bool lora : {false, true}) {
    const std::string what = std::string("sharded checkpoint") + (lora ? " lora" : " full");
    const std::filesystem::path dir = root / (lora ? "iter-000002-lora" : "iter-000002-full");
    const bg::sharding_options sharding{.mode = bg::sharding_mode::gradients, .bucket_megabytes = 1e-4};
    const tiny_run sharded =
        train_tiny(comm, lora, sharding, comm.size(), torch::kFloat32, {.first = 0, .last = 2, .write_to = dir});
    const bg::checkpoint_contents assembled = bg::read_checkpoint(dir);
    expect(assembled.layout && assembled.layout->shards == comm.size() && assembled.layout->step == 2,
           what + ": the layout does not say " + std::to_string(comm.size()) + " shards at step 2");
    for (const auto& [name, tensor] : sharded.state.weights)
      expect(torch::equal(assembled.weights.at(name), tensor), what + ": assembled weight " + name + " differs");
    for (const auto& [name, tensor] : sharded.state.state)
      expect(torch::equal(assembled.state.at(name), tensor), what + ": assembled " + name + " differs");
    // Every world size's ranges: the slice of the flat masters, moments and EMA.
    std::vector<torch::Tensor> masters, averages;
    for (const std::string& name : tiny_names(lora)) {
      masters.push_back(sharded.state.weights.at(name));
      averages.push_back(sharded.state.state.at("ema." + name));
    }
    const torch::Tensor flat_masters = flat_of(masters), flat_ema = flat_of(averages);
    for (int size = 1; size <= 3; ++size)
      for (int r = 0; r < size; ++r) {
        const bg::flat_shard range = bg::flat_shard::of(flat_masters.numel(), r, size);
        const auto [contents, read] = bg::read_checkpoint_range(dir, range.lo, range.hi);
        expect(
            torch::equal(read.tensors.at("master").to(torch::kFloat64),
                         flat_masters.narrow(0, range.lo, range.count())) &&
                torch::equal(read.tensors.at("ema").to(torch::kFloat64), flat_ema.narrow(0, range.lo, range.count())),
            what + ": range of rank " + std::to_string(r) + " of " + std::to_string(size) + " differs");
      }
    // Resume: each rank reads its own range and takes update 3.
    const bg::flat_shard mine = bg::flat_shard::of(flat_masters.numel(), comm.rank(), comm.size());
    const auto [contents, range] = bg::read_checkpoint_range(dir, mine.lo, mine.hi);
    const tiny_run resumed =
        train_tiny(comm, lora, sharding, comm.size(), torch::kFloat32, {.first = 2, .last = 3, .start_range = &range});
    const tiny_run straight = train_tiny(one, lora, {}, comm.size());
    const double worst = max_relative_difference(resumed.parameters, straight.parameters);
    expect(worst < (comm.size() == 2 ? 1e-6 : 1e-5),
           what + ": resumed from the shards, differs by " + std::to_string(worst));
    comm.barrier();  // every rank has read the shards before rank 0 damages them
    if (comm.rank() == 0) {
      std::cout << "rank 0: zero: " << what << ": " << comm.size() << " shards, resumed max relative difference "
                << worst << "\n";
      const std::filesystem::path shard = dir / shard_1;
      std::string bytes;
      {
        std::ifstream in(shard, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
      }
      bytes[bytes.size() - 1] = static_cast<char>(bytes.back() ^ 1);
      std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
      const std::string flipped = bg::checkpoint_problem(dir);
      expect(flipped.starts_with((dir / shard_1).string() + ": checksum mismatch (xxh64 "),
             what + ": a flipped byte gives '" + flipped + "'");
      std::filesystem::remove(shard);
      const std::string missing = bg::checkpoint_problem(dir);
      expect(missing == (dir / shard_1).string() + ": missing (manifest.txt lists it)",
             what + ": a missing shard gives '" + missing + "'");
    }
  }
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(root);
}

int sharding_one_process() {
  bg::single_process one;
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16})
    for (const bool lora : {false, true})
      for (const bg::sharding_mode mode : {bg::sharding_mode::optimizer, bg::sharding_mode::gradients}) {
        const tiny_run sharded = train_tiny(one, lora, {.mode = mode, .bucket_megabytes = 1e-4}, 2, dtype);
        const tiny_run plain = train_tiny(one, lora, {}, 2, dtype);
        const std::string what = std::string(bg::sharding_name(mode)) + (lora ? " lora " : " full ") +
                                 (dtype == torch::kFloat32 ? "float32" : "bfloat16");
        expect(bit_identical(sharded.parameters, plain.parameters), what + ": parameters not bit-identical");
        expect(bit_identical(sharded.ema, plain.ema), what + ": EMA not bit-identical");
        expect(sharded.norms == plain.norms, what + ": gradient norms differ");
        expect(sharded.state_elements == plain.state_elements, what + ": optimizer state sizes differ");
      }
  // More ranks than elements: rank 99 of 100 owns nothing, and its AdamW and EMA hold nothing.
  struct rank_99_of_100 : bg::single_process {
    [[nodiscard]] int rank() const { return 99; }
    [[nodiscard]] int size() const { return 100; }
  } last;
  tiny_model model(false);
  bg::autograd_policy empty(model, bg::torch_backend{},
                            {.optimizer = {.ema_decay = 0.5}, .sharding = {.mode = bg::sharding_mode::gradients}},
                            last);
  expect(empty.shard().count() == 0 && empty.shard_masters().empty() && empty.ema_parameters().empty() &&
             empty.optimizer_state_elements() == 0,
         "an empty shard holds state");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {error_of([] { (void)bg::parse_sharding_mode("zero2", "optimizer.sharding"); }),
       "optimizer.sharding = \"zero2\": must be none, optimizer, gradients or parameters"},
      {error_of([] { bg::validate_sharding({.mode = bg::sharding_mode::parameters}, "optimizer"); }),
       "optimizer.sharding = \"parameters\": not built in this version; docs/distributed.md gives its design"},
      {error_of(
           [] { bg::validate_sharding({.mode = bg::sharding_mode::gradients, .bucket_megabytes = 0}, "optimizer"); }),
       "optimizer.bucket_mb = 0: must be in (0, 65536]"},
  };
  for (const auto& [got, want] : cases) expect(got == want, "sharding error '" + got + "', expected '" + want + "'");
  std::cout << "zero_one: ok\n";
  return 0;
}

// Two checkpoints' trainable tensors: the relative difference ||a - b|| / ||a|| over all of them must be at most
// `tolerance`. Adam normalizes each element's update, so an element whose gradient is at the rounding level moves
// by an amount set by that rounding: element-wise relative differences are printed too, but not the criterion.
int compare_files(const std::string& a, const std::string& b, double tolerance) {
  // A checkpoint directory stands for its trainable weights (a sharded one's shards assembled).
  const auto weights = [](const std::string& path) {
    return std::filesystem::is_directory(path) ? bg::read_checkpoint(path).weights : bg::load_safetensors(path);
  };
  const auto left = weights(a), right = weights(b);
  expect(left.size() == right.size() && !left.empty(), "the files hold different tensor names");
  double differences = 0, norms = 0, worst_tensor = 0;
  for (const auto& [name, tensor] : left) {
    const auto other = right.find(name);
    expect(other != right.end() && other->second.sizes() == tensor.sizes(), name + ": missing or another shape");
    const torch::Tensor x = tensor.to(torch::kFloat64), y = other->second.to(torch::kFloat64);
    const double difference = (x - y).square().sum().item<double>(), norm = x.square().sum().item<double>();
    differences += difference;
    norms += norm;
    if (norm > 0) worst_tensor = std::max(worst_tensor, std::sqrt(difference / norm));
  }
  const double relative = std::sqrt(differences / norms);
  std::cout << "compare: " << left.size() << " tensors, relative difference " << relative << " (the worst tensor's "
            << worst_tensor << ")\n";
  expect(relative <= tolerance,
         "relative difference " + std::to_string(relative) + " over " + std::to_string(tolerance));
  return 0;
}

int run(const std::string& scenario, double timeout) {
  if (scenario == "environment") return environment_checks();
  if (scenario == "zero_one") return sharding_one_process();
  const std::optional<bg::launch_environment> environment = bg::launch_environment_from_process();
  expect(environment.has_value(), "WORLD_SIZE is not set: start the ranks with run_ranks.sh");
  const int rank = environment->rank;
  if (scenario == "rank1_absent" && rank == 1) return 0;
  std::optional<bg::c10d_communicator> comm = bg::communicator_from_environment({.timeout_seconds = timeout});
  expect(comm.has_value() && comm->rank() == rank, "joined");
  expect(comm->device() == torch::Device(torch::kCPU) || comm->device().index() == environment->local_rank,
         "device from LOCAL_RANK");
  if (scenario == "join") return 0;
  phase_start = std::chrono::steady_clock::now();
  if (scenario == "collectives") {
    collectives(*comm);
  } else if (scenario == "toy") {
    const std::vector<double> mine = train_toy(*comm);
    bg::check_same_everywhere(
        *comm,
        bg::xxh64_digest(std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double))),
        "parameters");
    if (rank == 0) {
      bg::single_process one;
      const std::vector<double> alone = train_toy(one);
      double worst = 0;
      for (std::size_t i = 0; i < mine.size(); ++i)
        worst = std::max(worst, std::abs(mine[i] - alone[i]) / std::max(std::abs(alone[i]), 1e-12));
      std::cout << "rank 0: toy: max relative difference " << worst << '\n';
      expect(worst < 1e-9, "the toy's parameters differ from one process's by " + std::to_string(worst));
    }
  } else if (scenario == "zero") {
    sharded_training(*comm);
    sharded_checkpoints(*comm);
  } else if (scenario == "exposure") {
    comm->barrier();  // every rank joined: the sockets are all there
    if (rank == 0) check_exposure(environment->master_port);
    comm->barrier();
  } else if (scenario == "config_mismatch") {
    bg::check_same_everywhere(*comm, bg::xxh64_digest("config of rank " + std::to_string(rank)), "configs");
    expect(false, "the configs differ, yet check_same_everywhere returned");
  } else if (scenario == "size_mismatch") {
    std::vector<double> values(static_cast<std::size_t>(rank) + 1, 1.0);  // a bug: sizes differ across the ranks
    comm->all_reduce_sum(values);
    expect(false, "the sizes differ, yet all_reduce_sum returned");
  } else if (scenario == "rank1_exits" || scenario == "rank1_hangs" || scenario == "rank0_exits") {
    std::vector<double> values{1.0};
    comm->all_reduce_sum(values);
    const int victim = scenario == "rank0_exits" ? 0 : 1;
    if (rank == victim) {
      if (scenario == "rank1_hangs") std::this_thread::sleep_for(std::chrono::seconds(120));
      std::_Exit(7);  // a crash: no destructors, no goodbye
    }
    comm->all_reduce_sum(values);
    comm->barrier();
    expect(false, "rank " + std::to_string(victim) + " is gone, yet the collectives returned");
  } else {
    expect(false, "unknown scenario " + scenario);
  }
  std::cout << "rank " << rank << ": ok\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "verify" && argc == 3) {
    const std::string problem = bg::checkpoint_problem(argv[2]);
    if (!problem.empty()) std::cerr << "verify: " << problem << '\n';
    return problem.empty() ? 0 : 1;
  }
  if (scenario == "compare" && argc == 5) {
    try {
      return compare_files(argv[2], argv[3], std::stod(argv[4]));
    } catch (const std::exception& error) {
      std::cerr << "compare: " << error.what() << '\n';
      return 2;
    }
  }
  const double timeout = argc > 2 ? std::stod(argv[2]) : 5.0;
  const std::string rank = std::getenv("RANK") != nullptr ? std::getenv("RANK") : "?";
  try {
    return run(scenario, timeout);
  } catch (const check_failed& failure) {
    std::cerr << "FAILED: rank " << rank << ": " << failure.what() << '\n';
    return 2;
  } catch (const std::exception& error) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_start).count();
    const std::string text = error.what();
    std::cerr << (scenario == "join" ? "test_distributed" : "rank " + rank) << ": " << text << '\n';
    if (text.find('\n') != std::string::npos) return 3;
    if (seconds > timeout + 1) {
      std::cout << "rank " << rank << " failed after " << seconds << " s, over the timeout of " << timeout << " s\n";
      return 4;
    }
    return 1;
  }
}
