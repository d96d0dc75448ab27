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
//   join             joins from the environment and leaves (the environment errors, one line)
//   exposure         rank 0 checks, after the join on MASTER_ADDR=127.0.0.1, that every socket it listens on (the
//                    store's, Gloo's) accepts only this host: bound to a loopback address or to the loopback
//                    interface, read back from /proc/net/tcp{,6} (exposure.hpp), and that the store refuses
//                    connections through every other address of this host while accepting 127.0.0.1
//   compare A B TOL  one process: the tensors of two safetensors files agree within the relative tolerance TOL
//                    (||a - b|| / ||a|| over all of them); prints "compare: N tensors, relative difference X ..."
//   environment      one process: read_launch_environment's checks over made-up environments
//
// An expected failure prints "rank R: <message>" (one line) on stderr and exits 1; a failed check prints
// "FAILED: ..." and exits 2; an error of several lines exits 3; one later than the timeout (+1 s) after the join
// (or the start, for a failed join) exits 4.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/torch/distributed.hpp"
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

// Two checkpoints' trainable tensors: the relative difference ||a - b|| / ||a|| over all of them must be at most
// `tolerance`. Adam normalizes each element's update, so an element whose gradient is at the rounding level moves
// by an amount set by that rounding: element-wise relative differences are printed too, but not the criterion.
int compare_files(const std::string& a, const std::string& b, double tolerance) {
  const auto left = bg::load_safetensors(a), right = bg::load_safetensors(b);
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
