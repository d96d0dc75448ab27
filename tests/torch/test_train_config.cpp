// `branchgrpo train`'s machinery on a small random model in the shipped model's format (3 x 16 x 16 pixels, the
// shapes FLUX config): a config file loads the model directory and builds the rewards; a run resumed from a
// checkpoint ends bit-identical to the uninterrupted run (CPU); the AdamW state is what makes it so; a crash
// between writing a checkpoint and renaming it leaves the previous checkpoint usable. (Parsing every key and
// rejecting bad ones: tests/unit/test_run_config.cpp.)
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/app/training_run.hpp"
#include "reward_server_process.hpp"

namespace bg = branchgrpo;

namespace {

// A fresh directory under the system temp dir.
std::filesystem::path scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("branchgrpo_test_train_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A model directory as `branchgrpo pretrain` writes it, holding random weights (seed 3) of the shapes config
// and the 12 shapes prompts' word embeddings.
std::filesystem::path make_model_dir() {
  const auto dir = scratch("model");
  const bg::flux_config config = bg::shapes_flux_config();
  torch::manual_seed(3);
  bg::flux_transformer model(config);
  bg::save_safetensors(dir / "model.safetensors", bg::flux_state(model),
                       {{std::string(bg::flux_config_metadata_key), bg::format_flux_config(config)}});
  const std::vector<std::string> prompts = bg::shapes_prompts();
  bg::save_prompt_file(dir / "prompts.safetensors",
                       bg::shapes_word_embeddings(prompts, config.context_in, config.vec_in), prompts);
  return dir;
}

// A config for a short run: 4 steps, a tree splitting at steps 0 and 2, per-prompt running advantages (state
// to checkpoint), EMA (state to checkpoint), two optimizer steps per iteration, LoRA rank 2.
std::string run_toml(const std::filesystem::path& model, const std::filesystem::path& out, int iterations) {
  return "[model]\ndir = \"" + model.string() +
         "\"\n"
         "[data]\nprompts_per_iteration = 2\n"
         "[topology]\nsplit_steps = [0, 2]\nbranching = [2]\n"
         "[rollout]\nsteps = 4\nmax_batch = 8\n"
         "[advantage]\nkind = \"per_prompt_running\"\nhistory = 16\n"
         "[optimizer]\nlr = 1e-3\nema_decay = 0.5\n"
         "[lora]\nrank = 2\nalpha = 2.0\n"
         "[[rewards]]\nname = \"alignment\"\n"
         "[[rewards]]\nname = \"jpeg_compressibility\"\nweight = 0.1\nparams = { quality = 90 }\n"
         "[run]\niterations = " +
         std::to_string(iterations) + "\nseed = 5\nupdates_per_iteration = 2\noutput_dir = \"" + out.string() + "\"\n";
}

bg::run_config config_for(const std::filesystem::path& model, const std::filesystem::path& out, int iterations) {
  return bg::parse_run_config(run_toml(model, out, iterations), "run.toml");
}

std::unique_ptr<bg::training_run> make_run(const bg::run_config& config) {
  bg::run_model model = bg::load_run_model(config);
  bg::weighted_sum reward = bg::make_run_reward(config, model);
  return std::make_unique<bg::training_run>(config, std::move(model), std::move(reward));
}

// A copy of a run's trainable tensors, to compare with after a step.
std::vector<torch::Tensor> trainable_copy(bg::training_run& run) {
  std::vector<torch::Tensor> copy;
  for (const auto& [name, tensor] : run.trainable()) copy.push_back(tensor.detach().clone());
  return copy;
}

// Whether any trainable tensor of `run` differs from `before` (trainable_copy, taken from the same run).
bool weights_changed(bg::training_run& run, const std::vector<torch::Tensor>& before) {
  const auto after = run.trainable();
  for (std::size_t i = 0; i < after.size(); ++i)
    if (!torch::equal(after[i].second, before[i])) return true;
  return false;
}

// Whether two runs' trainable tensors are bit-identical.
bool same_weights(bg::training_run& a, bg::training_run& b) {
  const auto x = a.trainable(), y = b.trainable();
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i].first != y[i].first || !torch::equal(x[i].second, y[i].second)) return false;
  return true;
}

}  // namespace

TEST_CASE("a config file loads the model directory and the rewards, and a run trains its LoRA factors") {
  const auto model = make_model_dir();
  const auto out = scratch("load");
  const auto file = out / "run.toml";
  std::ofstream(file) << run_toml(model, out / "run", 2);
  const bg::run_config config = bg::load_run_config(file);
  const bg::run_model m = bg::load_run_model(config);
  CHECK(m.prompts.size() == 12);
  CHECK(m.shape.dims == std::vector<std::int64_t>{3, 16, 16});
  CHECK(m.embeddings.width() == 32);
  auto run = make_run(config);
  // rank-2 LoRA on the attention and MLP layers only: every trainable tensor is a LoRA factor.
  for (const auto& [name, tensor] : run->trainable()) CHECK(name.find(".lora_") != std::string::npos);
  CHECK(run->prompts_of(0) == std::vector<std::int64_t>{0, 1});
  CHECK(run->prompts_of(7) == std::vector<std::int64_t>{2, 3});  // (7 * 2) mod 12
  const std::vector<torch::Tensor> initial = trainable_copy(*run);
  const bg::iteration_stats stats = run->step(/*keep_images=*/true);
  CHECK(stats.rollout_evaluations == 2 * (1 + 2 + 2 + 4));  // 2 trees of {0, 2} x 2 over 4 steps
  CHECK(std::isfinite(stats.reward_mean));
  CHECK(run->last_images().sizes() == torch::IntArrayRef({8, 3, 16, 16}));
  CHECK(run->last_prompts() == std::vector<std::int64_t>{0, 0, 0, 0, 1, 1, 1, 1});
  CHECK(run->last_components().count("alignment") == 1);
  CHECK(run->last_components().count("jpeg_compressibility") == 1);
  CHECK(weights_changed(*run, initial));
  CHECK(run->iteration() == 1);
  const torch::Tensor samples = run->sample(std::vector<std::int64_t>{0, 5, 11}, 9);
  CHECK(samples.sizes() == torch::IntArrayRef({3, 3, 16, 16}));
  CHECK(torch::equal(samples, run->sample(std::vector<std::int64_t>{0, 5, 11}, 9)));  // keyed: deterministic
}

TEST_CASE("[objective] nft and awm train the LoRA factors through the LibTorch policy, with the rows counted") {
  const auto model = make_model_dir();
  // run_toml: 2 trees of 4 leaves (splits at steps 0 and 2, K = 2), two optimizer steps per iteration, max_batch 8.
  struct objective_case {
    std::string table;
    std::int64_t rows, update_evaluations;
  };
  const std::vector<objective_case> cases = {
      // 8 leaves x 2 noise levels; each row's v_old first (16), then two rows each under the policy (32), in calls
      // of at most max_batch / 2 = 4 samples.
      {"[objective]\nkind = \"nft\"\nbeta = 0.5\ntimes_per_sample = 2\n", 16, 16 + 32},
      // 8 leaves and the 2 x 2 internal split nodes at step 2; lp_old for each row first (two optimizer steps).
      {"[objective]\nkind = \"awm\"\nintermediate_nodes = true\n", 12, 12 + 12}};
  for (const objective_case& c : cases) {
    CAPTURE(c.table);
    const bg::run_config config =
        bg::parse_run_config(run_toml(model, scratch("objective") / "run", 1) + c.table, "run.toml");
    auto run = make_run(config);
    const std::vector<torch::Tensor> initial = trainable_copy(*run);
    const bg::iteration_stats stats = run->step();
    CHECK(stats.rollout_evaluations == 2 * (1 + 2 + 2 + 4));
    CHECK(stats.edges_trained == c.rows);
    CHECK(stats.update_evaluations == c.update_evaluations);
    CHECK(std::isfinite(stats.loss));
    CHECK(weights_changed(*run, initial));
  }
}

TEST_CASE("a run on a prompt dataset in shards, shuffled per epoch, trains as on the same prompts in memory") {
  const auto model = make_model_dir();
  const auto out = scratch("dataset");
  // The model directory's 12 prompts in 3 shards of 4, as export_prompt_embeddings.py --shard-rows 4 writes them.
  const bg::prompt_file all = bg::load_prompt_file(model / "prompts.safetensors");
  const auto shards = out / "prompts";
  std::filesystem::create_directories(shards);
  for (std::int64_t k = 0; k < 3; ++k)
    bg::save_prompt_file(shards / ("p-0000" + std::to_string(k + 1) + "-of-00003.safetensors"),
                         bg::prompt_embeddings{.context = all.embeddings.context.slice(0, 4 * k, 4 * k + 4),
                                               .pooled = all.embeddings.pooled.slice(0, 4 * k, 4 * k + 4)},
                         std::vector<std::string>(all.prompts.begin() + 4 * k, all.prompts.begin() + 4 * k + 4));
  bg::run_config mapped = config_for(model, out / "mapped", 1), in_memory = config_for(model, out / "memory", 1);
  mapped.data.embeddings = shards.string();
  mapped.data.shuffle = in_memory.data.shuffle = true;
  auto a = make_run(mapped), b = make_run(in_memory);
  // Shuffled by run.seed = 5: every prompt once in the 6 iterations of an epoch, as prompt_schedule says.
  std::vector<std::int64_t> epoch;
  for (int i = 0; i < 6; ++i) {
    CHECK(a->prompts_of(i) ==
          bg::prompt_schedule{.prompt_count = 12, .per_iteration = 2, .shuffle = true, .seed = 5}(i));
    for (const std::int64_t p : a->prompts_of(i)) epoch.push_back(p);
  }
  std::sort(epoch.begin(), epoch.end());
  CHECK(epoch == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(a->prompts_of(0) != std::vector<std::int64_t>{0, 1});
  // Rows read from the mapped shards are the rows in memory: the same iteration, bit for bit.
  const bg::iteration_stats sa = a->step(), sb = b->step();
  CHECK(sa.reward_mean == sb.reward_mean);
  CHECK(same_weights(*a, *b));
  // The dataset directory is one input of the run: its shards by name, size and checksum.
  CHECK_THAT(bg::config_text(mapped), Catch::Matchers::Contains("# input data.embeddings = \"3 shards, "));
}

TEST_CASE("a [[rewards]] entry with win_rate = true scores each leaf by its win rate within its tree") {
  const auto model = make_model_dir();
  std::string toml = run_toml(model, scratch("win_rate") / "run", 1);
  const std::string jpeg = "weight = 0.1\nparams = { quality = 90 }";
  REQUIRE(toml.find(jpeg) != std::string::npos);
  toml.replace(toml.find(jpeg), jpeg.size(), "weight = 0.1\nwin_rate = true\nparams = { quality = 90 }");
  const bg::run_config config = bg::parse_run_config(toml, "run.toml");
  CHECK(config.rewards[1].win_rate);
  CHECK_THAT(bg::config_text(config), Catch::Matchers::Contains("win_rate = true"));
  auto run = make_run(config);
  const bg::iteration_stats stats = run->step();
  CHECK(std::isfinite(stats.reward_mean));
  // With ties counting 1/2, a tree's m win rates sum to m / 2: the mean over every tree is 1/2 exactly.
  CHECK(run->last_components().at("jpeg_compressibility") == 0.5);
  CHECK(run->last_components().at("alignment") > 0);
}

TEST_CASE("the remote reward trains as the in-process one; a dead server is one line, and --resume continues") {
  const auto model = make_model_dir();
  const std::string rewards =
      "[[rewards]]\nname = \"alignment\"\n[[rewards]]\nname = \"jpeg_compressibility\"\nweight = 0.1\nparams = "
      "{ quality = 90 }\n";
  const auto with_rewards = [&](const std::filesystem::path& out, const std::string& entries) {
    std::string toml = run_toml(model, out, 2);
    REQUIRE(toml.find(rewards) != std::string::npos);
    toml.replace(toml.find(rewards), rewards.size(), entries);
    return bg::parse_run_config(toml, "run.toml");
  };
  auto local = make_run(with_rewards(scratch("local"), "[[rewards]]\nname = \"alignment\"\n"));
  bg::testing::reward_server server({"--scorer", "shapes_alignment"});
  const std::string remote_entry = "[[rewards]]\nname = \"remote\"\nparams = { url = \"" + server.url() +
                                   "\", scorer = \"shapes_alignment\", retries = 0 }\n";
  const auto remote_dir = scratch("remote");
  auto remote = make_run(with_rewards(remote_dir, remote_entry));
  // The same leaves, scored in C++ and by the server (float32 pixels, float64 formula): the rewards to 1e-12, the
  // trained factors to 1e-9 relative after two iterations.
  for (int i = 0; i < 2; ++i) {
    const bg::iteration_stats a = local->step(), b = remote->step();
    CHECK(b.reward_mean == Approx(a.reward_mean).epsilon(0).margin(1e-12));
    CHECK(b.reward_max == Approx(a.reward_max).epsilon(0).margin(1e-12));
  }
  // The server's components (shapes_alignment: colour and shape) are logged as remote/<component>; the score is
  // their colour_weight mix (0.5 by default), so the means mix the same way.
  const std::map<std::string, double>& parts = remote->last_components();
  REQUIRE(parts.count("remote/colour") == 1);
  REQUIRE(parts.count("remote/shape") == 1);
  CHECK(parts.at("remote") == Approx(0.5 * parts.at("remote/colour") + 0.5 * parts.at("remote/shape")).margin(1e-12));
  const auto x = local->trainable(), y = remote->trainable();
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(torch::allclose(x[i].second, y[i].second, /*rtol=*/1e-9, /*atol=*/1e-12));

  // win_rate = true on a remote entry: the server's scores become win rates within each tree, mean 1/2 exactly.
  {
    const std::string entry =
        "[[rewards]]\nname = \"remote\"\nwin_rate = true\nparams = { url = \"" + server.url() + "\", retries = 0 }\n";
    auto ranked = make_run(with_rewards(scratch("remote_win_rate"), entry));
    (void)ranked->step();
    CHECK(ranked->last_components().at("remote") == 0.5);
  }

  // The server dies mid-run: the next iteration is one line naming the url, a failure of the system (exit 1), not a
  // refusal of the input; the checkpoint before it resumes.
  const auto dying_dir = scratch("dying");
  auto dying = make_run(with_rewards(dying_dir, remote_entry));
  (void)dying->step();
  const auto checkpoint = dying->save_checkpoint();
  server.stop();
  try {
    (void)dying->step();
    FAIL("the step did not fail");
  } catch (const bg::system_failure& error) {
    CHECK_THAT(std::string(error.what()), Catch::Matchers::StartsWith("remote reward " + server.url() + "/score: ") &&
                                              Catch::Matchers::EndsWith("(after 1 attempt)"));
  }
  // A server that is not there when the run starts is refused before the first iteration.
  try {
    (void)make_run(with_rewards(scratch("nobody"), remote_entry));
    FAIL("the run started without its server");
  } catch (const bg::invalid_input& error) {
    CHECK_THAT(std::string(error.what()), Catch::Matchers::StartsWith("remote reward " + server.url() + "/info: "));
  }
  CHECK(std::filesystem::exists(checkpoint));
  // The server back on its port: --resume continues from the checkpoint to exactly the uninterrupted run's weights.
  const std::string port = server.url().substr(server.url().rfind(':') + 1);
  bg::testing::reward_server back({"--scorer", "shapes_alignment", "--port", port});
  REQUIRE(back.url() == server.url());
  auto resumed = make_run(with_rewards(dying_dir, remote_entry));
  REQUIRE(resumed->resume() == checkpoint);
  (void)resumed->step();
  CHECK(same_weights(*resumed, *remote));
}

TEST_CASE("a vlm_judge reward trains through an OpenAI-compatible server; each leaf is one request") {
  const auto model = make_model_dir();
  const auto log = scratch("vlm_log") / "requests.jsonl";
  bg::testing::reward_server server({"--model", "test/judge-vl", "--log", log.string()},
                                    "tests/rewards/fake_openai_server.py");
  std::string toml = run_toml(model, scratch("vlm"), 1);
  const std::string alignment = "[[rewards]]\nname = \"alignment\"\n";
  REQUIRE(toml.find(alignment) != std::string::npos);
  toml.insert(toml.find(alignment), "[[rewards]]\nname = \"vlm_judge\"\nparams = { url = \"" + server.url() +
                                        "\", model = \"test/judge-vl\", question = \"Is it {prompt}?\", "
                                        "retries = 0 }\n");
  auto run = make_run(bg::parse_run_config(toml, "run.toml"));
  const bg::iteration_stats stats = run->step();
  CHECK(std::isfinite(stats.reward_mean));
  // 2 prompts x 4 leaves, one request each; the fake server's P(yes) is (0.05 + 0.8 r) / 0.9 with r the PNG's mean
  // red: the reward's mean is the mean of those to 1e-12.
  std::ifstream lines(log);
  std::vector<nlohmann::json> requests;
  for (std::string line; std::getline(lines, line);) requests.push_back(nlohmann::json::parse(line));
  REQUIRE(requests.size() == 8);
  const std::vector<std::string> prompts = bg::shapes_prompts();
  double mean = 0;
  for (const nlohmann::json& r : requests) {
    CHECK(r["width"] == 16);
    const std::string question = r["question"].get<std::string>();
    CHECK(std::any_of(prompts.begin(), prompts.end(),
                      [&](const std::string& p) { return question == "Is it " + p + "?"; }));
    mean += (0.05 + 0.8 * r["red"].get<double>()) / 0.9 / 8;
  }
  CHECK(run->last_components().at("vlm_judge") == Approx(mean).epsilon(0).margin(1e-12));

  // A name the server does not serve is refused before the first iteration.
  const bg::run_config wrong = bg::parse_run_config("[model]\ndir = \"" + model.string() +
                                                        "\"\n[[rewards]]\nname = \"vlm_judge\"\nparams = { url = \"" +
                                                        server.url() + "\", model = \"other/model\" }\n",
                                                    "run.toml");
  CHECK_THROWS_WITH(bg::make_run_reward(wrong, bg::load_run_model(wrong)),
                    "vlm judge " + server.url() + ": no model 'other/model' (the server serves: test/judge-vl)");
}

TEST_CASE("vlm_judge_reward: a clip's middle frame is judged; a non-finite row is NaN and not sent") {
  bg::testing::reward_server server({"--model", "m"}, "tests/rewards/fake_openai_server.py");
  bg::vlm_judge_reward judge({.url = server.url(), .model = "m", .patience = {.retries = 0}}, {"a red circle"});
  // Clips [2, 3 frames, 3, 4, 4]: row 0's middle frame fully red (x = 1 -> byte 255), row 1's red 0 (x = -1); the
  // other frames the opposite.
  torch::Tensor clips = torch::full({2, 3, 3, 4, 4}, -1.0);
  clips.index_put_({0, 1, 0}, 1.0);
  clips.index_put_({1, 0, 0}, 1.0);
  clips.index_put_({1, 2, 0}, 1.0);
  const std::vector<std::int64_t> rows = {0, 0};
  const std::vector<double> scores = judge(clips, rows);
  REQUIRE(scores.size() == 2);
  CHECK(scores[0] == Approx(0.85 / 0.9).epsilon(1e-12));
  CHECK(scores[1] == Approx(0.05 / 0.9).epsilon(1e-12));
  torch::Tensor images = torch::zeros({2, 3, 4, 4});
  images[1][0][2][2] = std::nan("");
  const std::vector<double> mixed = judge(images, rows);
  CHECK(mixed[0] == Approx((0.05 + 0.8 * 128 / 255.0) / 0.9).epsilon(1e-12));  // x = 0 -> byte 128
  CHECK(std::isnan(mixed[1]));
  CHECK_THROWS_WITH(judge(images, std::vector<std::int64_t>{0, 3}),
                    "vlm judge row 1 has prompt 3, the prompt list has 1");
}

TEST_CASE("reward parameters are checked with one line naming them") {
  const auto model = make_model_dir();
  const auto with_reward = [&](const std::string& reward) {
    const std::string toml = "[model]\ndir = \"" + model.string() + "\"\n" + reward;
    const bg::run_config config = bg::parse_run_config(toml, "run.toml");
    const bg::run_model m = bg::load_run_model(config);
    try {
      (void)bg::make_run_reward(config, m);
    } catch (const bg::invalid_input& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(with_reward("[[rewards]]\nname = \"jpeg_compressibility\"\nparams = { quality = 101 }\n") ==
        "run.toml: rewards[0].params.quality = 101: must be an integer in [1, 100]");
  CHECK(with_reward("[[rewards]]\nname = \"alignment\"\nparams = { colour_weight = 2 }\n") ==
        "run.toml: rewards[0].params.colour_weight = 2: must be in [0, 1]");
  CHECK(with_reward("[[rewards]]\nname = \"alignment\"\nparams = { colour = 1 }\n") ==
        "run.toml: unknown key rewards[0].params.colour (alignment has: colour_weight, colour_width, fill_width)");
  CHECK(with_reward("[[rewards]]\nname = \"jpeg_compressibility\"\nparams = { quality = \"high\" }\n") ==
        "run.toml: rewards[0].params.quality = 'high': must be a number");
  CHECK(with_reward("[[rewards]]\nname = \"torchscript\"\n") ==
        "run.toml: rewards[0].params.file: the TorchScript reward needs a file");
  CHECK(with_reward("[[rewards]]\nname = \"jpeg_incompressibility\"\n").empty());
  CHECK(with_reward("[[rewards]]\nname = \"remote\"\n") ==
        "run.toml: rewards[0].params.url: the remote reward needs a url");
  CHECK(with_reward("[[rewards]]\nname = \"remote\"\nparams = { url = \"http://127.0.0.1:9\", timeout = 0 }\n") ==
        "run.toml: rewards[0].params.timeout = 0: must be in [0.001, 86400]");
  CHECK(with_reward("[[rewards]]\nname = \"remote\"\nparams = { url = \"http://127.0.0.1:9\", retries = 1.5 }\n") ==
        "run.toml: rewards[0].params.retries = 1.5: must be an integer");

  // A TorchScript reward exported (scripts/export_reward.py) for another prompt list is refused as the run starts.
  const bg::run_model run_model =
      bg::load_run_model(bg::parse_run_config("[model]\ndir = \"" + model.string() + "\"\n", "run.toml"));
  torch::jit::Module listed("listed_reward");
  listed.define(
      "def forward(self, images: Tensor, prompts: Tensor) -> Tensor:\n    return images.mean(dim=[1, 2, 3])\n");
  c10::impl::GenericList exported(c10::StringType::get());
  for (const std::string& prompt : run_model.prompts) exported.push_back(prompt);
  exported.push_back("one prompt more");
  listed.register_attribute(bg::torchscript_prompts_attribute, c10::ListType::ofStrings(), exported);
  const std::filesystem::path listed_file = model / "listed_reward.pt";
  listed.save(listed_file.string());
  const std::string count = std::to_string(run_model.prompts.size());
  const std::string prompt_file = (model / "prompts.safetensors").string();
  CHECK(with_reward("[[rewards]]\nname = \"torchscript\"\nparams = { file = \"" + listed_file.string() + "\" }\n") ==
        "TorchScript reward '" + listed_file.string() + "' was exported for another prompt list than " + prompt_file +
            ": the first " + count + " prompts are the same (" + std::to_string(run_model.prompts.size() + 1) +
            " prompts there, " + count + " here); re-export it with scripts/export_reward.py --prompts " + prompt_file);
  // vlm_judge: {params} -> "run.toml: rewards[0].params.<the line>", before any request to the server.
  const std::vector<std::pair<std::string, std::string>> judge_errors = {
      {"model = \"m\"", "url: the vlm_judge reward needs a url (the server's root, e.g. http://127.0.0.1:8000)"},
      {"url = \"http://127.0.0.1:9\"",
       "model: the vlm_judge reward needs the served model's name (e.g. Qwen/Qwen2.5-VL-7B-Instruct)"},
      {"url = \"127.0.0.1:9\", model = \"m\"", "url = '127.0.0.1:9': is not http:// or https://"},
      {"url = \"http://h/v1\", model = \"m\"",
       "url = 'http://h/v1': ends in /v1: give the server's root (the judge posts to <url>/v1/chat/completions)"},
      {"url = \"http://h\", model = \"m\", question = \"Is it good?\"",
       "question = 'Is it good?': has no {prompt} (the judge would ask every image the same question)"},
      {"url = \"http://h\", model = \"m\", top_logprobs = 21", "top_logprobs = 21: must be in [1, 20]"},
      {"url = \"http://h\", model = \"m\", top_logprobs = 2.5", "top_logprobs = 2.5: must be an integer"},
      {"url = \"http://h\", model = \"m\", timeout = 0", "timeout = 0: must be in [0.001, 86400]"},
  };
  for (const auto& [params, line] : judge_errors)
    CHECK(with_reward("[[rewards]]\nname = \"vlm_judge\"\nparams = { " + params + " }\n") ==
          "run.toml: rewards[0].params." + line);
}

TEST_CASE("resume continues to exactly the uninterrupted run's weights (CPU, bit-identical)") {
  const auto model = make_model_dir();
  const auto straight_dir = scratch("straight"), resumed_dir = scratch("resumed");

  auto straight = make_run(config_for(model, straight_dir, 4));
  while (!straight->done()) (void)straight->step();

  {
    auto first_half = make_run(config_for(model, resumed_dir, 4));
    (void)first_half->step();
    (void)first_half->step();
    const auto dir = first_half->save_checkpoint();
    CHECK(dir.filename() == "iter-000002");
    const bg::checkpoint_contents saved = bg::read_checkpoint(dir);
    CHECK(saved.iteration == 2);
    CHECK(saved.seed == 5);
    // AdamW: 2 iterations x 2 updates = step 4 for every factor; both moments saved; EMA and normalizer too.
    const std::string some = first_half->trainable().back().first;
    REQUIRE(saved.state.count("adamw.step." + some) == 1);
    CHECK(saved.state.at("adamw.step." + some).item<std::int64_t>() == 4);
    CHECK(saved.state.count("adamw.exp_avg." + some) == 1);
    CHECK(saved.state.count("adamw.exp_avg_sq." + some) == 1);
    CHECK(saved.state.count("ema." + some) == 1);
    CHECK(saved.state.count("normalizer.prompt.0") == 1);       // prompts 0..3 seen in iterations 0 and 1
    CHECK(saved.state.at("normalizer.prompt.3").numel() == 4);  // 4 leaves per tree
    CHECK_FALSE(same_weights(*first_half, *straight));
  }

  auto resumed = make_run(config_for(model, resumed_dir, 4));
  const auto from = resumed->resume();
  REQUIRE(from.has_value());
  CHECK(resumed->iteration() == 2);
  while (!resumed->done()) (void)resumed->step();
  CHECK(same_weights(*resumed, *straight));
  // The EMA shadows agree too.
  for (std::size_t i = 0; i < straight->policy().ema_parameters().size(); ++i)
    CHECK(torch::equal(straight->policy().ema_parameters()[i], resumed->policy().ema_parameters()[i]));

  SECTION("without the optimizer state the result differs: the AdamW moments are part of the state") {
    auto forgetful = make_run(config_for(model, resumed_dir, 4));
    bg::checkpoint_contents contents = bg::read_checkpoint(*from);
    for (auto it = contents.state.begin(); it != contents.state.end();)
      it = it->first.rfind("adamw.", 0) == 0 ? contents.state.erase(it) : std::next(it);
    forgetful->restore(contents);
    while (!forgetful->done()) (void)forgetful->step();
    CHECK_FALSE(same_weights(*forgetful, *straight));
  }
}

TEST_CASE("a crash between writing a checkpoint and renaming it leaves the previous one usable") {
  const auto model = make_model_dir();
  const auto out = scratch("atomic");
  auto run = make_run(config_for(model, out, 3));
  (void)run->step();
  const auto first = run->save_checkpoint();
  const bg::checkpoint_contents at_one = run->checkpoint();
  (void)run->step();
  // The crash: iteration 2's files are written into iter-000002.tmp, the rename never happens.
  const auto staged = bg::stage_checkpoint(bg::checkpoint_path(run->checkpoint_root(), 2), run->checkpoint());
  CHECK(staged.filename() == "iter-000002.tmp");
  CHECK(std::filesystem::is_regular_file(staged / "weights.safetensors"));
  // A torn directory from an even earlier crash, and one named like a checkpoint but incomplete.
  std::filesystem::create_directories(run->checkpoint_root() / "iter-000009.tmp");
  std::filesystem::create_directories(run->checkpoint_root() / "iter-000008");
  REQUIRE(bg::latest_checkpoint(run->checkpoint_root()) == first);

  auto resumed = make_run(config_for(model, out, 3));
  REQUIRE(resumed->resume() == first);
  CHECK(resumed->iteration() == 1);
  const auto weights = resumed->trainable();
  for (const auto& [name, tensor] : weights) CHECK(torch::equal(tensor, at_one.weights.at(name)));

  // The next save of iteration 2 replaces the stale staging directory and commits.
  (void)resumed->step();
  const auto second = resumed->save_checkpoint();
  CHECK(second.filename() == "iter-000002");
  CHECK_FALSE(std::filesystem::exists(staged));
  CHECK_FALSE(std::filesystem::exists(run->checkpoint_root() / "iter-000009.tmp"));
  CHECK(bg::latest_checkpoint(run->checkpoint_root()) == second);
  CHECK(std::filesystem::exists(first));  // keep_checkpoints = 2 keeps the previous one
}

TEST_CASE("adamw_state_tensors round-trips through load_adamw_state") {
  torch::Tensor w = torch::tensor({1.0f, -2.0f}).requires_grad_(true);
  auto optimizer = bg::make_adamw({w}, {.lr = 0.1});
  w.mutable_grad() = torch::tensor({0.5f, 0.25f});
  optimizer->step();
  const std::vector<std::pair<std::string, torch::Tensor>> named = {{"w", w}};
  const auto saved = bg::adamw_state_tensors(*optimizer, named);
  REQUIRE(saved.size() == 3);
  CHECK(saved.at("adamw.step.w").item<std::int64_t>() == 1);
  // exp_avg = (1 - 0.9) g, exp_avg_sq = (1 - 0.999) g^2 after one step.
  CHECK(saved.at("adamw.exp_avg.w")[0].item<float>() == Approx(0.05).margin(1e-7));
  CHECK(saved.at("adamw.exp_avg_sq.w")[1].item<float>() == Approx(0.001 * 0.0625).margin(1e-9));
  auto fresh = bg::make_adamw({w}, {.lr = 0.1});
  bg::load_adamw_state(*fresh, named, saved);
  const auto again = bg::adamw_state_tensors(*fresh, named);
  for (const auto& [name, tensor] : saved) CHECK(torch::equal(tensor, again.at(name)));
  CHECK_THROWS_WITH(bg::load_adamw_state(*fresh, {{"w", torch::zeros({3}).requires_grad_(true)}}, saved),
                    Catch::Contains("optimizer state of 'w' has shape [2], the parameter [3]"));
}

TEST_CASE("sample after train: the EMA's weights by default, the trained ones with use_ema = false") {
  const auto model = make_model_dir();
  const auto out = scratch("ema_sample");
  const bg::run_config config = config_for(model, out, 2);  // optimizer.ema_decay = 0.5
  std::filesystem::path checkpoint;
  torch::Tensor ema_images, trained_images;
  std::vector<std::pair<std::string, torch::Tensor>> ema_weights, trained_weights;
  const std::vector<std::int64_t> prompts{0, 3};
  {
    auto run = make_run(config);
    while (!run->done()) (void)run->step();
    checkpoint = run->save_checkpoint();
    ema_images = run->sample(prompts, 7);  // swaps the EMA in and out
    trained_images = run->sample(prompts, 7, /*first=*/0, /*use_ema=*/false);
    for (const auto& [name, t] : run->named_masters()) trained_weights.emplace_back(name, t.detach().clone());
    for (std::size_t i = 0; i < trained_weights.size(); ++i)
      ema_weights.emplace_back(trained_weights[i].first, run->policy().ema_parameters()[i].detach().clone());
  }
  CHECK_FALSE(torch::equal(ema_images, trained_images));

  auto sampler = make_run(config_for(model, scratch("ema_sample_2"), 2));
  CHECK(sampler->load_weights(checkpoint));  // default: the EMA's
  for (std::size_t i = 0; i < ema_weights.size(); ++i)
    CHECK(torch::equal(sampler->named_masters()[i].second, ema_weights[i].second));
  CHECK(torch::equal(sampler->sample(prompts, 7), ema_images));

  CHECK_FALSE(sampler->load_weights(checkpoint, /*use_ema=*/false));
  for (std::size_t i = 0; i < trained_weights.size(); ++i)
    CHECK(torch::equal(sampler->named_masters()[i].second, trained_weights[i].second));
  CHECK(torch::equal(sampler->sample(prompts, 7, 0, false), trained_images));

  // A checkpoint of a run without EMA under a config with EMA: one line naming the checkpoint.
  bg::checkpoint_contents contents = bg::read_checkpoint(checkpoint);
  std::erase_if(contents.state, [](const auto& item) { return item.first.starts_with("ema."); });
  const auto stripped = out / "stripped" / "iter-000002";
  bg::write_checkpoint(stripped, contents);
  // The first missing name in name order (the checkpoint's tensors are looked up sorted).
  std::string first = sampler->trainable().front().first;
  for (const auto& [name, tensor] : sampler->trainable()) first = std::min(first, name);
  CHECK_THROWS_WITH(sampler->load_weights(stripped),
                    stripped.string() + ": no EMA of '" + first +
                        "' (was it written with optimizer.ema_decay = 0? sample with --no-ema)");
  std::filesystem::remove_all(out);
}

TEST_CASE("bfloat16 runs keep float32 masters in checkpoints and resume bit-identically") {
  const auto model = make_model_dir();
  const auto straight_dir = scratch("bf16_straight"), resumed_dir = scratch("bf16_resumed");
  const auto bf16 = [&](const std::filesystem::path& out) {
    std::string toml = run_toml(model, out, 2);
    toml.replace(toml.find("[data]"), 6, "dtype = \"bfloat16\"\n[data]");
    return bg::parse_run_config(toml, "run.toml");
  };
  auto straight = make_run(bf16(straight_dir));
  while (!straight->done()) (void)straight->step();
  REQUIRE(straight->policy().has_master_copies());
  for (const auto& [name, t] : straight->named_masters()) CHECK(t.scalar_type() == torch::kFloat32);
  for (const auto& [name, t] : straight->trainable()) CHECK(t.scalar_type() == torch::kBFloat16);

  auto first = make_run(bf16(resumed_dir));
  (void)first->step();
  const bg::checkpoint_contents saved = bg::read_checkpoint(first->save_checkpoint());
  for (const auto& [name, t] : saved.weights) CHECK(t.scalar_type() == torch::kFloat32);
  auto resumed = make_run(bf16(resumed_dir));
  REQUIRE(resumed->resume().has_value());
  (void)resumed->step();
  const auto a = straight->named_masters(), b = resumed->named_masters();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].second, b[i].second));
  CHECK(same_weights(*straight, *resumed));
}

TEST_CASE("[eval]: a held-out evaluation samples keyed ODE noise under the EMA and scores each prompt's group") {
  const auto model = make_model_dir();
  const auto out = scratch("eval");
  // Three held-out prompts in their own file (the shapes word embeddings, as pretrain writes them).
  const std::vector<std::string> heldout = {"a yellow circle", "a blue square", "a green triangle"};
  const bg::flux_config shapes = bg::shapes_flux_config();
  bg::save_prompt_file(out / "heldout.safetensors",
                       bg::shapes_word_embeddings(heldout, shapes.context_in, shapes.vec_in), heldout);
  const auto with_eval = [&](const std::filesystem::path& dir, const std::string& section) {
    return bg::parse_run_config(
        run_toml(model, dir, 2) + "[eval]\nembeddings = \"" + (out / "heldout.safetensors").string() + "\"\n" + section,
        "run.toml");
  };
  const std::string section = "every = 1\nsamples = 2\nsteps = 3\nseed = 4\n[[eval.rewards]]\nname = \"alignment\"\n";
  auto plain = make_run(config_for(model, scratch("eval_plain"), 2));
  auto run = make_run(with_eval(out / "run", section));
  CHECK(run->evaluates());
  CHECK(run->evaluates_after(0));
  CHECK(run->evaluates_after(2));  // every = 1, and after the last iteration
  CHECK(run->model().heldout.prompts == heldout);

  bg::single_process one;
  const bg::heldout_evaluation before = run->evaluate(one);
  CHECK(before.iteration == 0);
  CHECK(before.samples_per_prompt == 2);
  CHECK(before.first_row == 0);
  CHECK(before.ema);  // optimizer.ema_decay = 0.5 and eval.ema's default
  REQUIRE(before.images.sizes() == torch::IntArrayRef({6, 3, 16, 16}));
  REQUIRE(before.rewards.size() == 6);
  CHECK(before.prompt_of(3) == 1);
  // Row j * 2 + k: held-out prompt j (table row 12 + j, after the 12 training prompts), the keyed noise of tree
  // heldout_tree_key + j * 2 + k, 3 Euler steps; scored by the [eval] reward alone, on the held-out prompts.
  const std::vector<std::int64_t> table_rows = {12, 12, 13, 13, 14, 14};
  CHECK(torch::equal(before.images, run->sample(run->config().eval_schedule(), table_rows, 4, 0, true)));
  const std::vector<double> expected =
      bg::shape_alignment{.prompts = heldout}(before.images, std::vector<std::int64_t>{0, 0, 1, 1, 2, 2});
  CHECK(before.rewards == expected);
  CHECK(before.components.size() == 1);
  CHECK(before.components.at("alignment") == expected);

  // The held-out rows do not touch training: the same iterations as a run without [eval], bit for bit.
  CHECK(run->step().reward_mean == plain->step().reward_mean);
  CHECK(same_weights(*run, *plain));
  // The same noises after training: the weights, not the draws, differ; and under the EMA's, not the trained ones.
  const bg::heldout_evaluation after = run->evaluate(one);
  CHECK(after.iteration == 1);
  CHECK_FALSE(torch::equal(after.images, before.images));
  CHECK(torch::equal(after.images, run->sample(run->config().eval_schedule(), table_rows, 4, 0, true)));
  CHECK_FALSE(torch::equal(after.images, run->sample(run->config().eval_schedule(), table_rows, 4, 0, false)));
  // Deterministic: an evaluation repeated is the same.
  CHECK(torch::equal(run->evaluate(one).images, after.images));

  // eval.ema = false: the trained weights.
  auto trained = make_run(with_eval(out / "trained", "ema = false\n" + section));
  CHECK_FALSE(trained->evaluate(one).ema);

  // Groupwise [eval] rewards rank within a prompt's samples: 2 samples' win rates sum to 1, so the mean is 1/2.
  auto ranked = make_run(with_eval(out / "ranked",
                                   "samples = 2\n[[eval.rewards]]\nname = \"jpeg_compressibility\"\n"
                                   "win_rate = true\n"));
  const bg::heldout_evaluation wins = ranked->evaluate(one);
  for (std::size_t j = 0; j < 3; ++j)
    CHECK(wins.components.at("jpeg_compressibility")[2 * j] + wins.components.at("jpeg_compressibility")[2 * j + 1] ==
          1.0);
  // Without [[eval.rewards]]: the run's own rewards.
  auto same_rewards = make_run(with_eval(out / "same", "samples = 2\n"));
  const bg::heldout_evaluation own = same_rewards->evaluate(one);
  CHECK(own.components.size() == 2);
  CHECK(own.components.count("jpeg_compressibility") == 1);

  // Bad input: one line naming the key.
  CHECK_THROWS_WITH(make_run(with_eval(out / "bad",
                                       "[[eval.rewards]]\nname = \"jpeg_compressibility\"\nparams = "
                                       "{ quality = 0 }\n")),
                    "run.toml: eval.rewards[0].params.quality = 0: must be an integer in [1, 100]");
  const std::vector<std::string> single = {"a red circle"};
  bg::save_prompt_file(out / "single.safetensors", bg::shapes_word_embeddings(single, shapes.context_in, shapes.vec_in),
                       single);
  std::string toml = run_toml(model, out / "one", 2) + "[eval]\nembeddings = \"" +
                     (out / "single.safetensors").string() + "\"\nsamples = 1\n";
  CHECK_THROWS_WITH(make_run(bg::parse_run_config(toml, "run.toml")),
                    "run.toml: eval.samples = 1: " + (out / "single.safetensors").string() +
                        " holds 1 prompt; an evaluation's interval needs at least 2 samples in all");
  std::filesystem::remove_all(out);
}
