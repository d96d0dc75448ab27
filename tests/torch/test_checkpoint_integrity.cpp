// Checkpoint integrity (checkpoint.hpp, training_run::resume): a flipped byte, a missing file, a damaged manifest
// or a lost optimizer tensor is an error naming the file or the tensor; resume falls back to the newest checkpoint
// that verifies, with a warning per skipped one, and fails when none does; recover_checkpoints cleans what a kill
// left; a changed config is refused naming the keys (config_text.hpp), the keys that may change are listed.
// A small random model in the shipped model's format, one iteration of a 4-step tree: a few seconds.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/app/training_run.hpp"
#include "branchgrpo/config/config_text.hpp"
#include "branchgrpo/core/hash.hpp"

namespace bg = branchgrpo;

namespace {

std::filesystem::path scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("branchgrpo_test_integrity_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A model directory of random weights (seed 3) in the shapes format, as tests/torch/test_train_config.cpp makes.
std::filesystem::path make_model_dir(const std::string& name = "model", int seed = 3) {
  const auto dir = scratch(name);
  const bg::flux_config config = bg::shapes_flux_config();
  torch::manual_seed(seed);
  bg::flux_transformer model(config);
  bg::save_safetensors(dir / "model.safetensors", bg::flux_state(model),
                       {{std::string(bg::flux_config_metadata_key), bg::format_flux_config(config)}});
  const std::vector<std::string> prompts = bg::shapes_prompts();
  bg::save_prompt_file(dir / "prompts.safetensors",
                       bg::shapes_word_embeddings(prompts, config.context_in, config.vec_in), prompts);
  return dir;
}

std::string run_toml(const std::filesystem::path& model, const std::filesystem::path& out, int iterations,
                     const std::string& lr = "1e-3") {
  return "[model]\ndir = \"" + model.string() +
         "\"\n"
         "[topology]\nsplit_steps = [0, 2]\nbranching = [2]\n"
         "[rollout]\nsteps = 4\n"
         "[advantage]\nkind = \"per_prompt_running\"\n"
         "[optimizer]\nlr = " +
         lr +
         "\n"
         "[lora]\nrank = 2\nalpha = 2.0\n"
         "[run]\niterations = " +
         std::to_string(iterations) + "\nseed = 5\noutput_dir = \"" + out.string() + "\"\n";
}

std::unique_ptr<bg::training_run> make_run(const std::string& toml) {
  const bg::run_config config = bg::parse_run_config(toml, "run.toml");
  bg::run_model model = bg::load_run_model(config);
  bg::weighted_sum reward = bg::make_run_reward(config, model);
  return std::make_unique<bg::training_run>(config, std::move(model), std::move(reward));
}

// XORs one byte of `path` at `offset` from the end (1 = the last byte: tensor data, not the header).
void flip_byte(const std::filesystem::path& path, std::streamoff from_end = 1) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(-from_end, std::ios::end);
  const char c = static_cast<char>(file.get());
  file.seekp(-from_end, std::ios::end);
  file.put(static_cast<char>(c ^ 0x20));
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `body` as a manifest with a correct self-checksum (to test what the parser refuses).
void write_manifest(const std::filesystem::path& dir, const std::string& body) {
  std::ofstream(dir / "manifest.txt", std::ios::binary)
      << body << "manifest " + bg::hex_digest(bg::xxh64_digest(body)) + "\n";
}

std::string error_of(const auto& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("a flipped byte, a missing file or a damaged manifest is named; resume falls back or fails",
          "[checkpoint][reliability]") {
  const auto model = make_model_dir();
  const auto out = scratch("fallback");
  auto run = make_run(run_toml(model, out, 3));
  const auto zero = run->save_checkpoint();  // iteration 0: no optimizer state yet
  (void)run->step();
  const auto one = run->save_checkpoint();
  const bg::checkpoint_contents at_one = run->checkpoint();
  CHECK(bg::checkpoint_problem(one).empty());
  CHECK(bg::checkpoint_problem(zero).empty());
  // The manifest lists every file with its size and hash; the canonical config is one of them.
  const std::string manifest = read(one / "manifest.txt");
  CHECK(manifest.starts_with("format branchgrpo-checkpoint-2\niteration 1\nseed 5\nfile weights.safetensors "));
  CHECK(read(one / "config.toml") == run->canonical_config());
  CHECK(bg::read_checkpoint(one).config_text == run->canonical_config());

  SECTION("a flipped data byte in the weights: checksum mismatch, resume falls back to iteration 0 with a warning") {
    flip_byte(one / "weights.safetensors");
    const std::string problem = bg::checkpoint_problem(one);
    CHECK(problem.starts_with((one / "weights.safetensors").string() + ": checksum mismatch (xxh64 "));
    CHECK(problem.find(", manifest says ") != std::string::npos);
    CHECK(error_of([&] { (void)bg::read_checkpoint(one); }) == problem);
    auto resumed = make_run(run_toml(model, out, 3));
    std::ostringstream log;
    CHECK(resumed->resume(log) == zero);
    CHECK(resumed->iteration() == 0);
    CHECK(log.str() == "warning: skipping checkpoint " + one.string() + ": " + problem + "\n");
    CHECK(std::filesystem::exists(one));  // a damaged checkpoint is named, never deleted

    SECTION("and with every checkpoint damaged, resume fails instead of starting afresh") {
      flip_byte(zero / "state.safetensors");
      auto again = make_run(run_toml(model, out, 3));
      std::ostringstream quiet;
      CHECK(error_of([&] { (void)again->resume(quiet); })
                .starts_with((out / "checkpoints").string() + ": no valid checkpoint among 2 (newest: " +
                             (one / "weights.safetensors").string() + ": checksum mismatch"));
    }
  }
  SECTION("a flipped byte in the optimizer state, the config or the manifest") {
    flip_byte(one / "state.safetensors");
    CHECK(bg::checkpoint_problem(one).starts_with((one / "state.safetensors").string() + ": checksum mismatch"));
    flip_byte(one / "state.safetensors");  // back
    CHECK(bg::checkpoint_problem(one).empty());
    flip_byte(one / "config.toml", 3);
    CHECK(bg::checkpoint_problem(one).starts_with((one / "config.toml").string() + ": checksum mismatch"));
    flip_byte(one / "config.toml", 3);
    flip_byte(one / "manifest.txt", 30);
    CHECK(bg::checkpoint_problem(one).starts_with((one / "manifest.txt").string() + ": checksum mismatch"));
  }
  SECTION("a missing or truncated file") {
    std::filesystem::resize_file(one / "state.safetensors", 100);
    CHECK(bg::checkpoint_problem(one).starts_with((one / "state.safetensors").string() +
                                                  ": size 100 bytes, the manifest says "));
    std::filesystem::remove(one / "state.safetensors");
    CHECK(bg::checkpoint_problem(one) == (one / "state.safetensors").string() + ": missing (manifest.txt lists it)");
    std::filesystem::remove(one / "manifest.txt");
    CHECK(bg::checkpoint_problem(one) == one.string() + ": not a valid checkpoint (no manifest.txt)");
  }
  SECTION("malformed manifests, even with a correct checksum, are refused naming the line") {
    const std::string files =
        manifest.substr(manifest.find("file "), manifest.find("manifest ") - manifest.find("file "));
    write_manifest(one, "format branchgrpo-checkpoint-2\niteration 1x\nseed 5\n" + files);
    CHECK(bg::checkpoint_problem(one) ==
          (one / "manifest.txt").string() + ": iteration = 1x: must be an integer in [0, 2147483647]");
    write_manifest(one, "format branchgrpo-checkpoint-2\niteration 1\nseed -1\n" + files);
    CHECK(bg::checkpoint_problem(one) ==
          (one / "manifest.txt").string() + ": seed = -1: must be an integer in [0, 18446744073709551615]");
    write_manifest(one, "format branchgrpo-checkpoint-9\niteration 1\nseed 5\n" + files);
    CHECK(bg::checkpoint_problem(one) == (one / "manifest.txt").string() +
                                             ": format 'branchgrpo-checkpoint-9' is not branchgrpo-checkpoint-2: "
                                             "not a valid checkpoint");
    write_manifest(one, "format branchgrpo-checkpoint-2\niteration 2\nseed 5\n" + files);
    CHECK(bg::checkpoint_problem(one) ==
          (one / "manifest.txt").string() + ": says iteration 2, the directory iter-000001");
  }
  SECTION("a checkpoint of the old format is refused by name") {
    const auto old = bg::checkpoint_path(out / "checkpoints", 7);
    std::filesystem::create_directories(old);
    bg::save_safetensors(old / "weights.safetensors", at_one.weights, {{"format", "branchgrpo-checkpoint-1"}});
    bg::save_safetensors(old / "state.safetensors", at_one.state,
                         {{"format", "branchgrpo-checkpoint-1"}, {"iteration", "7"}, {"seed", "5"}});
    CHECK(bg::checkpoint_problem(old) ==
          old.string() +
              ": a checkpoint of the old format branchgrpo-checkpoint-1 (no manifest.txt), which this version does "
              "not read: continue it with the version that wrote it");
    CHECK(bg::recover_checkpoints(out / "checkpoints").empty());  // kept: it is whole, only older
  }
}

TEST_CASE("a FIFO or a directory in a listed file's place, a shard included, is named as such, never as missing",
          "[checkpoint][reliability]") {
  const auto model = make_model_dir();
  const auto out = scratch("special");
  // optimizer.sharding on one process: a sharded checkpoint of one shard (shard-00000-of-00001.safetensors).
  std::string toml = run_toml(model, out, 2);
  toml.insert(toml.find("[lora]"), "sharding = \"optimizer\"\n");
  auto run = make_run(toml);
  (void)run->step();
  const auto dir = run->save_checkpoint();
  const auto shard = dir / "shard-00000-of-00001.safetensors";
  REQUIRE(std::filesystem::is_regular_file(shard));
  CHECK(bg::checkpoint_problem(dir).empty());
  const auto replace_by_fifo = [](const std::filesystem::path& path) {
    std::filesystem::remove(path);
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  };
  replace_by_fifo(shard);  // reported as missing before: std::filesystem::file_size fails on a FIFO
  CHECK(bg::checkpoint_problem(dir) == shard.string() + ": is a FIFO, not a checkpoint file");
  CHECK(error_of([&] { (void)bg::read_checkpoint(dir); }) == shard.string() + ": is a FIFO, not a checkpoint file");
  replace_by_fifo(dir / "state.safetensors");
  CHECK(bg::checkpoint_problem(dir) == (dir / "state.safetensors").string() + ": is a FIFO, not a checkpoint file");
  std::filesystem::remove(dir / "state.safetensors");
  std::filesystem::create_directory(dir / "state.safetensors");
  CHECK(bg::checkpoint_problem(dir) ==
        (dir / "state.safetensors").string() + ": is a directory, not a checkpoint file");
  std::filesystem::remove(dir / "state.safetensors");  // only a name that leads nowhere is missing
  CHECK(bg::checkpoint_problem(dir) == (dir / "state.safetensors").string() + ": missing (manifest.txt lists it)");
}

TEST_CASE("a lost optimizer tensor is an error, never a silently reset parameter", "[checkpoint][reliability]") {
  const auto model = make_model_dir();
  auto run = make_run(run_toml(model, scratch("optimizer"), 2));
  (void)run->step();
  const bg::checkpoint_contents saved = run->checkpoint();
  const std::string some = run->trainable().front().first;
  CHECK(saved.state.at("adamw.state." + some).item<std::int64_t>() == 1);
  auto other = make_run(run_toml(model, scratch("optimizer2"), 2));
  bg::checkpoint_contents lost = saved;
  lost.state.erase("adamw.exp_avg_sq." + some);
  CHECK(error_of([&] { other->restore(lost); }) == "optimizer state of '" + some + "' is incomplete: adamw.state." +
                                                       some + " = 1 but no adamw.exp_avg_sq." + some);
  lost = saved;
  for (const char* what : {"exp_avg", "exp_avg_sq", "step", "state"})
    lost.state.erase(std::string("adamw.") + what + "." + some);
  CHECK(error_of([&] { other->restore(lost); }) ==
        "optimizer state of '" + some + "' is missing (no adamw.state." + some + ")");
  other->restore(saved);  // whole: fine
  CHECK(other->iteration() == 1);
  // Before the first step every parameter says 0 and has no moments.
  auto fresh = make_run(run_toml(model, scratch("optimizer3"), 2));
  const bg::checkpoint_contents at_zero = fresh->checkpoint();
  CHECK(at_zero.state.at("adamw.state." + some).item<std::int64_t>() == 0);
  CHECK(at_zero.state.count("adamw.exp_avg." + some) == 0);
}

TEST_CASE("recover_checkpoints cleans what a kill left and never deletes a valid checkpoint",
          "[checkpoint][reliability]") {
  const auto model = make_model_dir();
  const auto out = scratch("recover");
  auto run = make_run(run_toml(model, out, 2));
  const auto root = run->checkpoint_root();
  const auto zero = run->save_checkpoint();
  // A staged directory, a half-deleted one, an incomplete "iter-N", and a checkpoint moved aside whose
  // replacement never arrived (a kill between commit_checkpoint's two renames).
  (void)bg::stage_checkpoint(bg::checkpoint_path(root, 3), run->checkpoint());
  std::filesystem::create_directories(root / "iter-000004.deleted");
  std::filesystem::create_directories(root / "iter-000005");
  std::ofstream(root / "iter-000005" / "weights.safetensors") << "x";
  std::filesystem::copy(zero, root / "iter-000006.old");
  const std::vector<std::string> done = bg::recover_checkpoints(root);
  CHECK(done == std::vector<std::string>{
                    "removed the interrupted " + (root / "iter-000003.tmp").string(),
                    "removed the interrupted " + (root / "iter-000004.deleted").string(),
                    "removed the incomplete " + (root / "iter-000005").string(),
                    "restored " + (root / "iter-000006").string() + " from " + (root / "iter-000006.old").string()});
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(root)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"iter-000000", "iter-000006"});
  CHECK(bg::checkpoint_problem(zero).empty());
  // The restored one says iteration 0 in a directory named 6: not valid, so the fallback skips it.
  CHECK(bg::find_checkpoint(root).found == zero);
}

TEST_CASE("resume compares the whole config: experiment keys are refused by name, the others listed",
          "[checkpoint][reliability][config]") {
  const auto model = make_model_dir();
  const auto out = scratch("config");
  {
    auto run = make_run(run_toml(model, out, 2));
    (void)run->save_checkpoint();
  }
  const auto dir = bg::checkpoint_path(out / "checkpoints", 0);
  std::ostringstream log;
  auto changed_lr = make_run(run_toml(model, out, 2, "2e-3"));
  CHECK(error_of([&] { (void)changed_lr->resume(log); }) ==
        dir.string() +
            ": cannot resume: the config changes optimizer.lr (0.001 -> 0.002), which change the experiment "
            "(restore them, or start a new run in another run.output_dir)");
  auto longer = make_run(run_toml(model, out, 5));
  CHECK(longer->resume(log) == dir);
  CHECK(log.str() == "resume: changed run.iterations (2 -> 5)\n");
  // The same path holding another base model (other random weights) is another experiment.
  (void)make_model_dir("model", 4);
  auto other_model = make_run(run_toml(model, out, 2));
  const std::string message = error_of([&] { (void)other_model->resume(log); });
  CHECK(message.starts_with(dir.string() + ": cannot resume: the config changes input model.dir/model.safetensors ("));
}

TEST_CASE("config_text is complete, canonical and a valid config", "[config][reliability]") {
  const std::string toml =
      "[model]\ndir = \"some \\\"quoted\\\" dir\"\n"
      "[topology]\nkind = \"split_schedule\"\nsplit_steps = [0, 2]\nbranching = [3]\n"
      "[rollout]\nsteps = 6\nstepper = \"dance_sde\"\neta = 0.5\n"
      "[correlator]\nkind = \"correlated\"\ns = 2.0\n"
      "[advantage]\nkind = \"per_prompt_running\"\n"
      "[pruning]\nactive_fraction = 0.5\n[[pruning.pruners]]\nkind = \"parent_top_k\"\nk = 1\n"
      "[[rewards]]\nname = \"jpeg_compressibility\"\nweight = 0.5\nparams = { quality = 90 }\n"
      "[[rewards]]\nname = \"alignment\"\n"
      "[run]\niterations = 3\n";
  const bg::run_config config = bg::parse_run_config(toml, "run.toml");
  const std::string text = bg::config_text(config, /*inputs=*/false);
  CHECK(text.find("model.dir = \"some \\\"quoted\\\" dir\"\n") != std::string::npos);
  CHECK(text.find("topology.kind = \"split_schedule\"\ntopology.split_steps = [0, 2]\n") != std::string::npos);
  CHECK(text.find("rollout.stepper = \"dance_sde\"\n") != std::string::npos);
  CHECK(text.find("rollout.eta = 0.5\n") != std::string::npos);
  CHECK(text.find("optimizer.lr = 1e-05\n") != std::string::npos);  // a default, written out
  CHECK(text.find("pruning.pruners = [{ kind = \"parent_top_k\", k = 1 }]\n") != std::string::npos);
  CHECK(text.find("rewards = [{ name = \"jpeg_compressibility\", weight = 0.5, params = { quality = 90.0 } }, "
                  "{ name = \"alignment\", weight = 1.0, params = {} }]\n") != std::string::npos);
  // Read back, it is the same config.
  const bg::run_config again = bg::parse_run_config(text, "canonical.toml");
  CHECK(bg::config_text(again, false) == text);
  CHECK(bg::same_recipe(again.recipe, config.recipe));
  CHECK((again.rewards == config.rewards));
  // The default config too.
  CHECK(bg::config_text(bg::parse_run_config(bg::config_text(bg::run_config{}, false), "d.toml"), false) ==
        bg::config_text(bg::run_config{}, false));

  const auto changes = bg::compare_config_text("optimizer.lr = 0.001\nrun.iterations = 2\n# input m = \"1\"\n",
                                               "optimizer.lr = 0.002\nrun.iterations = 3\n# input m = \"2\"\n");
  CHECK((changes.refused ==
         std::vector<bg::config_change>{{"optimizer.lr", "0.001", "0.002"}, {"input m", "\"1\"", "\"2\""}}));
  CHECK((changes.allowed == std::vector<bg::config_change>{{"run.iterations", "2", "3"}}));
  CHECK(bg::config_changes_text(changes.refused) == "optimizer.lr (0.001 -> 0.002), input m (\"1\" -> \"2\")");
  CHECK(bg::compare_config_text(text, text).empty());
  CHECK(bg::resume_may_change("rollout.max_batch"));
  CHECK_FALSE(bg::resume_may_change("model.dtype"));
}
