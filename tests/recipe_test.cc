// Recipes: the defaults, each kind of error with its exact message (line, key, what is allowed,
// did-you-mean), --set overrides, the rules between keys, the resolved recipe loading back to the
// same run, and docs/recipes.md matching the schema it is generated from.
#include "train/recipe/recipe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "train/recipe/blocks.h"
#include "train/recipe/configs.h"
#include "source_dir.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class RecipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("recipe_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes TEXT as DIR/NAME and returns its path.
  std::string put(const std::string& text, const std::string& name = "x.toml") const {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  Recipe load_ok(const std::string& text, const std::vector<std::string>& overrides = {}) const {
    absl::StatusOr<Recipe> r = load_recipe(put(text), overrides);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : Recipe();
  }
  // The message of loading TEXT, with the file's path replaced by "FILE"; it must be one line.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) const {
    std::string path = put(text);
    absl::StatusOr<Recipe> r = load_recipe(path, overrides);
    if (r.ok()) return "(loaded without error)";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    std::string message(r.status().message());
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (message.rfind(path, 0) == 0) message = "FILE" + message.substr(path.size());
    return message;
  }

  fs::path dir_;
};

TEST_F(RecipeTest, DefaultsAreTheDocumentedOnes) {
  Recipe r;
  EXPECT_EQ(r.model.arch, "decoder");
  EXPECT_EQ(r.model.mixer, "attention");
  EXPECT_EQ(r.model.pattern, "");
  EXPECT_EQ(r.model.vocab_size, 0);
  EXPECT_EQ(r.model.d_model, 256);
  EXPECT_EQ(r.model.n_layers, 4);
  EXPECT_EQ(r.model.n_heads, 4);
  EXPECT_EQ(r.model.n_kv_heads, 0);
  EXPECT_EQ(r.model.d_ff, 0);
  // "auto" until a recipe is loaded (AutoSettingsFollowTheMixers).
  EXPECT_EQ(r.model.mlp, "auto");
  EXPECT_EQ(r.model.norm, "auto");
  EXPECT_EQ(r.model.norm_eps, 1e-5);
  EXPECT_EQ(r.model.positions, "auto");
  EXPECT_EQ(r.model.rope_base, 10000.0);
  EXPECT_EQ(r.model.bias, std::nullopt);
  EXPECT_EQ(r.model.mixers.at("gla").integer("chunk_size"), 64);
  EXPECT_EQ(r.model.mixers.at("linear_attention").text("feature_map"), "elu+1");
  EXPECT_FALSE(r.model.flat_mixer_keys);
  EXPECT_TRUE(r.model.tie_embeddings);
  EXPECT_EQ(r.model.dropout, 0.0);
  EXPECT_EQ(r.model.init_std, 0.02);

  EXPECT_EQ(r.data.source, "text");
  EXPECT_EQ(r.data.path, "/usr/share/games/fortunes");
  EXPECT_EQ(r.data.format, "auto");
  EXPECT_EQ(r.data.jsonl_field, "text");
  EXPECT_EQ(r.data.tokenizer, "byte");
  EXPECT_EQ(r.data.tokenizer_path, "");
  EXPECT_EQ(r.data.val_fraction, 0.05);
  EXPECT_EQ(r.data.cache_dir, "data/cache");
  EXPECT_EQ(r.data.objective, "lm");
  EXPECT_EQ(r.data.mask_fraction, 0.15);
  EXPECT_FALSE(r.data.next_sentence);
  EXPECT_EQ(r.data.noise_density, 0.15);
  EXPECT_EQ(r.data.mean_span_length, 3.0);
  EXPECT_EQ(r.data.task_vocab, 64);
  EXPECT_EQ(r.data.task_num_pairs, 8);
  EXPECT_EQ(r.data.task_copy_len, 16);

  EXPECT_EQ(r.train.steps, 1000);
  EXPECT_EQ(r.train.batch_size, 8);
  EXPECT_EQ(r.train.seq_len, 256);
  EXPECT_EQ(r.train.seed, 1337);
  EXPECT_EQ(r.train.grad_accum, 1);
  EXPECT_EQ(r.train.device, "auto");
  EXPECT_EQ(r.train.dtype, "f32");
  EXPECT_EQ(r.train.on_nonfinite, "stop");
  EXPECT_EQ(r.train.max_skipped, 10);

  EXPECT_EQ(r.optim.name, "adamw");
  EXPECT_EQ(r.optim.lr, 1e-3);
  EXPECT_EQ(r.optim.beta1, 0.9);
  EXPECT_EQ(r.optim.beta2, 0.95);
  EXPECT_EQ(r.optim.eps, 1e-8);
  EXPECT_EQ(r.optim.weight_decay, 0.1);
  EXPECT_EQ(r.optim.momentum, 0.9);
  EXPECT_FALSE(r.optim.nesterov);
  EXPECT_EQ(r.optim.grad_clip, 1.0);
  EXPECT_EQ(r.optim.schedule, "cosine");
  EXPECT_EQ(r.optim.warmup_steps, 30);
  EXPECT_EQ(r.optim.min_lr_ratio, 0.1);
  EXPECT_FALSE(r.optim.decay_norms);
  EXPECT_FALSE(r.optim.decay_biases);
  EXPECT_FALSE(r.optim.decay_embeddings);

  EXPECT_EQ(r.parallel.threads, 0);

  EXPECT_EQ(r.log.every, 10);
  EXPECT_EQ(r.log.eval_every, 100);
  EXPECT_EQ(r.log.eval_batches, 20);
  EXPECT_EQ(r.log.sample_every, 200);
  EXPECT_EQ(r.log.sample_tokens, 128);
  EXPECT_EQ(r.log.sample_prompt, "");
  EXPECT_EQ(r.log.sample_temperature, 0.8);
  EXPECT_EQ(r.log.progress, "auto");
  EXPECT_EQ(r.log.out_dir, "");

  EXPECT_TRUE(r.eval.seq_len.empty());

  EXPECT_EQ(r.checkpoint.every, 200);
  EXPECT_EQ(r.checkpoint.keep, 3);
  EXPECT_TRUE(r.checkpoint.save_on_signal);
}

TEST_F(RecipeTest, EmptyFileIsAllDefaultsAndNamedAfterItsStem) {
  absl::StatusOr<Recipe> r = load_recipe(put("# nothing here\n", "tiny_run.toml"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "tiny_run");
  EXPECT_EQ(r->source_path, (dir_ / "tiny_run.toml").string());
  EXPECT_EQ(r->run_dir(), "runs/tiny_run");
  Recipe defaults;
  defaults.name = r->name;
  defaults.source_path = r->source_path;
  // Loading resolves the "auto" settings: every block is attention, so GPT-2's.
  defaults.model.mlp = "gelu";
  defaults.model.norm = "layernorm";
  defaults.model.positions = "learned";
  defaults.model.bias = true;
  defaults.model.norm_placement = "pre";
  EXPECT_EQ(resolved_recipe_toml(*r), resolved_recipe_toml(defaults));
}

TEST_F(RecipeTest, GptSmallRecipeLoads) {
  absl::StatusOr<Recipe> r = load_recipe(std::string(SEQLAB_SOURCE_DIR) + "/recipes/gpt_small.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "gpt_small");
  EXPECT_EQ(r->model.d_model, 256);
  EXPECT_EQ(r->model.n_layers, 4);
  EXPECT_EQ(r->model.n_heads, 4);
  EXPECT_EQ(r->model.positions, "learned");
  EXPECT_EQ(r->model.norm, "layernorm");
  EXPECT_EQ(r->model.mlp, "gelu");
  EXPECT_EQ(r->data.tokenizer, "byte");
  EXPECT_EQ(r->data.path, "/usr/share/games/fortunes");
  EXPECT_EQ(r->data.format, "fortune");
  EXPECT_EQ(r->train.seq_len, 256);
  EXPECT_EQ(r->train.batch_size, 8);
  EXPECT_EQ(r->train.steps, 1000);
  EXPECT_EQ(r->train.dtype, "auto");  // bf16 where the CPU has bf16 instructions (docs/perf.md)
  EXPECT_EQ(r->optim.name, "adamw");
  EXPECT_EQ(r->optim.lr, 1e-3);
  EXPECT_EQ(r->optim.beta1, 0.9);
  EXPECT_EQ(r->optim.beta2, 0.95);
  EXPECT_EQ(r->optim.weight_decay, 0.1);
  EXPECT_EQ(r->optim.warmup_steps, 30);
  EXPECT_EQ(r->optim.schedule, "cosine");
  EXPECT_EQ(r->optim.min_lr_ratio, 0.1);
  EXPECT_EQ(r->optim.grad_clip, 1.0);
  EXPECT_EQ(r->log.eval_every, 100);
  EXPECT_EQ(r->checkpoint.every, 200);
}

TEST_F(RecipeTest, ValuesOfEveryType) {
  Recipe r = load_ok(
      "[model]\nbias = false\nmlp = \"swiglu\"\nnorm_eps = 1e-6\n"
      "[optim]\nlr = 1\n"  // an integer where a number is expected
      "[data]\npath = \"corpus/a b.txt\"\n"
      "[train]\nseed = 0\n");
  EXPECT_EQ(r.model.bias, false);
  EXPECT_EQ(r.model.mlp, "swiglu");
  EXPECT_EQ(r.model.norm_eps, 1e-6);
  EXPECT_EQ(r.optim.lr, 1.0);
  EXPECT_EQ(r.data.path, "corpus/a b.txt");
  EXPECT_EQ(r.train.seed, 0);
}

TEST_F(RecipeTest, DottedKeysAndInlineTablesAreTheSameSections) {
  Recipe r = load_ok("train.steps = 50\noptim = { lr = 0.5, warmup_steps = 5 }\n");
  EXPECT_EQ(r.train.steps, 50);
  EXPECT_EQ(r.optim.lr, 0.5);
  EXPECT_EQ(r.optim.warmup_steps, 5);
}

TEST_F(RecipeTest, WrongTypeNamesLineKeyAllowedAndGot) {
  EXPECT_EQ(error_of("# steps\n\n[train]\nbatch_size = 4\n\n\nsteps = \"ten\"\n"),
            "FILE:7: train.steps must be an integer ≥ 1, got a string \"ten\"");
  EXPECT_EQ(error_of("[train]\nsteps = 10.5\n"), "FILE:2: train.steps must be an integer ≥ 1, got a floating-point number 10.5");
  EXPECT_EQ(error_of("[model]\nbias = \"yes\"\n"), "FILE:2: model.bias must be true, false or \"auto\", got \"yes\"");
  EXPECT_EQ(error_of("[model]\nbias = 1\n"), "FILE:2: model.bias must be true, false or \"auto\", got an integer 1");
  EXPECT_EQ(error_of("[optim]\nlr = true\n"), "FILE:2: optim.lr must be a number > 0, got a boolean true");
  EXPECT_EQ(error_of("[data]\npath = 3\n"), "FILE:2: data.path must be a string, got an integer 3");
  EXPECT_EQ(error_of("[data]\npath = [\"a\"]\n"), "FILE:2: data.path must be a string, got an array");
  EXPECT_EQ(error_of("[train]\nseed = 1979-05-27\n"), "FILE:2: train.seed must be an integer ≥ 0, got a date or time");
}

TEST_F(RecipeTest, OutOfRange) {
  EXPECT_EQ(error_of("[train]\nsteps = -5\n"), "FILE:2: train.steps must be an integer ≥ 1, got -5");
  EXPECT_EQ(error_of("[model]\ndropout = 1.0\n"), "FILE:2: model.dropout must be a number in [0, 1), got 1.0");
  EXPECT_EQ(error_of("[data]\nval_fraction = 0\n"), "FILE:2: data.val_fraction must be a number in (0, 0.5], got 0.0");
  EXPECT_EQ(error_of("[optim]\nlr = inf\n"), "FILE:2: optim.lr must be a number > 0, got inf");
  EXPECT_EQ(error_of("[optim]\nlr = nan\n"), "FILE:2: optim.lr must be a number > 0, got nan");
  EXPECT_EQ(error_of("[optim]\nmin_lr_ratio = 1.5\n"), "FILE:2: optim.min_lr_ratio must be a number in [0, 1], got 1.5");
  EXPECT_EQ(error_of("[checkpoint]\nkeep = 0\n"), "FILE:2: checkpoint.keep must be an integer ≥ 1, got 0");
  // The bounds themselves are allowed where closed.
  Recipe r = load_ok("[data]\nval_fraction = 0.5\n[optim]\nmin_lr_ratio = 0\ngrad_clip = 0\n[checkpoint]\nevery = 0\n");
  EXPECT_EQ(r.data.val_fraction, 0.5);
  EXPECT_EQ(r.checkpoint.every, 0);
}

TEST_F(RecipeTest, BadChoiceListsTheChoices) {
  EXPECT_EQ(error_of("[optim]\nschedule = \"cosin\"\n"),
            "FILE:2: optim.schedule must be one of \"cosine\", \"linear\", \"constant\", got \"cosin\" "
            "(did you mean \"cosine\"?)");
  EXPECT_EQ(error_of("[model]\nmlp = \"gelux\"\n"),
            "FILE:2: model.mlp must be one of \"auto\", \"gelu\", \"swiglu\", \"relu\", \"geglu\", \"none\", "
            "\"moe\", got \"gelux\" (did you mean \"gelu\"?)");
  EXPECT_EQ(error_of("[model]\nmlp = \"mixture\"\n"),
            "FILE:2: model.mlp must be one of \"auto\", \"gelu\", \"swiglu\", \"relu\", \"geglu\", \"none\", "
            "\"moe\", got \"mixture\"");
  EXPECT_EQ(error_of("[model]\narch = \"bert\"\n"),
            "FILE:2: model.arch must be one of \"decoder\", \"encoder\", \"encoder_decoder\", got \"bert\"");
  // The choices are the registry's, attention (the default) first: adding a mixer adds it here by itself.
  std::string mixers;
  for (const std::string& m : mixer_choices()) mixers += (mixers.empty() ? "\"" : ", \"") + m + "\"";
  EXPECT_EQ(mixer_choices().front(), "attention");
  EXPECT_EQ(error_of("[model]\nmixer = \"glaa\"\n"),
            "FILE:2: model.mixer must be one of " + mixers + ", got \"glaa\" (did you mean \"gla\"?)");
}

TEST_F(RecipeTest, UnknownKeysSuggestNearMisses) {
  EXPECT_EQ(error_of("[train]\nstep = 5\n"), "FILE:2: unknown key train.step (did you mean train.steps?)");
  EXPECT_EQ(error_of("[train]\nbatchsize = 5\n"), "FILE:2: unknown key train.batchsize (did you mean train.batch_size?)");
  // A key in the wrong section points to the right one.
  EXPECT_EQ(error_of("[optim]\nsteps = 5\n"), "FILE:2: unknown key optim.steps (did you mean train.steps?)");
  // Same distance in two sections: the key's own section wins (log.every, not checkpoint.every).
  EXPECT_EQ(error_of("[log]\nevry = 5\n"), "FILE:2: unknown key log.evry (did you mean log.every?)");
  EXPECT_EQ(error_of("[checkpoint]\nevry = 5\n"), "FILE:2: unknown key checkpoint.evry (did you mean checkpoint.every?)");
  // Nothing near: the section's keys.
  EXPECT_EQ(error_of("[parallel]\nfrobnicate = 1\n"), "FILE:2: unknown key parallel.frobnicate ([parallel] has threads, sp, overlap)");
  EXPECT_EQ(error_of("[train]\n[train.extra]\nx = 1\n"),
            "FILE:2: unknown key train.extra ([train] has steps, batch_size, seq_len, seed, grad_accum, device, dtype, "
            "on_nonfinite, max_skipped)");
}

TEST_F(RecipeTest, UnknownSectionsAndKeysOutsideSections) {
  EXPECT_EQ(error_of("[trian]\nsteps = 5\n"), "FILE:1: unknown section [trian] (did you mean [train]?)");
  EXPECT_EQ(error_of("\n[hardware]\n"),
            "FILE:2: unknown section [hardware] (sections: model, data, train, optim, parallel, log, eval, checkpoint)");
  EXPECT_EQ(error_of("steps = 5\n"), "FILE:1: steps is outside any section (did you mean train.steps under [train]?)");
  EXPECT_EQ(error_of("train = 5\n"), "FILE:1: train must be a section [train], got an integer 5");
  EXPECT_EQ(error_of("[[train]]\nsteps = 5\n"), "FILE:1: train must be a section [train], got an array");
}

TEST_F(RecipeTest, TheFirstErrorInTheFileIsReported) {
  // toml++ keeps keys sorted; the report must still follow the file's order.
  EXPECT_EQ(error_of("[train]\nzzz = 1\nsteps = 0\n"), "FILE:2: unknown key train.zzz ([train] has steps, batch_size, "
                                                      "seq_len, seed, grad_accum, device, dtype, on_nonfinite, "
                                                      "max_skipped)");
  EXPECT_EQ(error_of("[train]\nsteps = 0\nbatch_size = 0\n[model]\nd_model = 0\n"),
            "FILE:2: train.steps must be an integer ≥ 1, got 0");
}

TEST_F(RecipeTest, SyntaxErrorNamesLineAndColumn) {
  std::string message = error_of("[train]\nsteps = = 3\n");
  EXPECT_EQ(message.rfind("FILE:2:", 0), 0u) << message;
  EXPECT_NE(message.find("TOML syntax error: "), std::string::npos) << message;
  message = error_of("[train]\nsteps = 1\nsteps = 2\n");  // a key defined twice is a TOML error
  EXPECT_EQ(message.rfind("FILE:3:", 0), 0u) << message;
}

TEST_F(RecipeTest, MissingFile) {
  absl::StatusOr<Recipe> r = load_recipe((dir_ / "nope.toml").string());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "recipe not found: " + (dir_ / "nope.toml").string());
  r = load_recipe(dir_.string());  // a folder is not a recipe either
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RecipeTest, OverridesParseTomlValuesAndBareStrings) {
  Recipe r = load_ok("[train]\nsteps = 100\n",
                     {"optim.lr=3e-4", "train.steps=2000", "model.bias=false", "optim.schedule=linear",
                      "data.path=/data/my corpus.txt", "log.sample_prompt=\"Once upon\"", "log.out_dir=42",
                      "model.norm_eps=1", " train.seed = 7", "train.batch_size=3", "train.batch_size=4"});
  EXPECT_EQ(r.optim.lr, 3e-4);
  EXPECT_EQ(r.train.steps, 2000);
  EXPECT_EQ(r.model.bias, false);
  EXPECT_EQ(r.optim.schedule, "linear");
  EXPECT_EQ(r.data.path, "/data/my corpus.txt");
  EXPECT_EQ(r.log.sample_prompt, "Once upon");
  EXPECT_EQ(r.log.out_dir, "42");  // a string key takes a non-string value as text
  EXPECT_EQ(r.model.norm_eps, 1.0);
  EXPECT_EQ(r.train.seed, 7);
  EXPECT_EQ(r.train.batch_size, 4);  // the last one wins
}

TEST_F(RecipeTest, MalformedOverrides) {
  const std::string file = "[train]\nsteps = 100\n";
  EXPECT_EQ(error_of(file, {"train.steps=abc"}), "--set train.steps=abc: train.steps must be an integer ≥ 1, got abc");
  EXPECT_EQ(error_of(file, {"train.steps=\"10\""}),
            "--set train.steps=\"10\": train.steps must be an integer ≥ 1, got a string \"10\"");
  EXPECT_EQ(error_of(file, {"train.steps=0"}), "--set train.steps=0: train.steps must be an integer ≥ 1, got 0");
  EXPECT_EQ(error_of(file, {"train.steps="}), "--set train.steps=: train.steps must be an integer ≥ 1, got nothing");
  EXPECT_EQ(error_of(file, {"train.steps"}), "--set train.steps: expected section.key=value");
  EXPECT_EQ(error_of(file, {"steps=10"}), "--set steps=10: expected section.key=value (did you mean train.steps?)");
  EXPECT_EQ(error_of(file, {"train.step=5"}), "--set train.step=5: unknown key train.step (did you mean train.steps?)");
  EXPECT_EQ(error_of(file, {"trian.steps=5"}), "--set trian.steps=5: unknown section [trian] (did you mean [train]?)");
  EXPECT_EQ(error_of(file, {"optim.schedule=cosin"}),
            "--set optim.schedule=cosin: optim.schedule must be one of \"cosine\", \"linear\", \"constant\", "
            "got \"cosin\" (did you mean \"cosine\"?)");
  // A value smuggling a second key is not one TOML value; the message stays on one line.
  std::string message = error_of(file, {"train.steps=1\nlr=2"});
  EXPECT_EQ(message.rfind("--set train.steps=1 lr=2: train.steps must be", 0), 0u) << message;
  // The first bad override is reported, after the file was found good.
  EXPECT_EQ(error_of(file, {"train.steps=5", "model.d_model=-1", "train.steps=x"}),
            "--set model.d_model=-1: model.d_model must be an integer ≥ 1, got -1");
  // A bad file is reported before any override.
  EXPECT_EQ(error_of("[train]\nsteps = 0\n", {"train.steps=x"}), "FILE:2: train.steps must be an integer ≥ 1, got 0");
}

TEST_F(RecipeTest, RulesBetweenKeysNameBothKeys) {
  EXPECT_EQ(error_of("[model]\nd_model = 256\nn_heads = 3\n"), "FILE:3: model.n_heads = 3 must divide model.d_model = 256");
  EXPECT_EQ(error_of("[model]\nn_heads = 4\nn_kv_heads = 3\n"),
            "FILE:3: model.n_kv_heads = 3 must divide model.n_heads = 4");
  EXPECT_EQ(error_of("[model]\npositions = \"rope\"\nd_model = 12\n"),
            "FILE:2: model.positions = \"rope\" needs an even head size, but model.d_model / model.n_heads = 12 / 4 = 3");
  EXPECT_EQ(error_of("[data]\n\ntokenizer = \"bpe\"\n"),
            "FILE:3: data.tokenizer = \"bpe\" needs data.tokenizer_path (the BPE merges file)");
  EXPECT_EQ(error_of("[model]\nvocab_size = 100\n"),
            "FILE:2: model.vocab_size = 100 is too small for data.tokenizer = \"byte\" (256 tokens); 0 takes the "
            "tokenizer's");
  // The message starts where a key of the rule was set: the file, or the override that broke it.
  const std::string sp3 =
      "parallel.sp = 3 needs train.seq_len divisible by 2·sp = 6 (each rank holds 2 of the sequence's 2·sp chunks); "
      "train.seq_len = 256 is not";
  EXPECT_EQ(error_of("[parallel]\nsp = 3\n"), "FILE:2: " + sp3);
  EXPECT_EQ(error_of("", {"parallel.sp=3"}), "--set parallel.sp=3: " + sp3);
  // The same rules pass when they hold.
  Recipe r = load_ok("[model]\nd_model = 96\nn_heads = 6\nn_kv_heads = 2\npositions = \"rope\"\nvocab_size = 300\n"
                     "[data]\ntokenizer = \"bpe\"\ntokenizer_path = \"merges.txt\"\n"
                     "[optim]\nwarmup_steps = 1000\n[train]\ndtype = \"bf16\"\n[parallel]\nsp = 4\n");
  EXPECT_EQ(r.model.n_kv_heads, 2);
  EXPECT_EQ(r.parallel.sp, 4);
}

// data.objective: its keys' ranges, keys of one objective set for another, text sources only, the
// shortest rows, span corruption's eval lengths, no sequence parallelism; and what loads.
TEST_F(RecipeTest, ObjectiveKeysAndTheirRules) {
  EXPECT_EQ(error_of("[data]\nobjective = \"mlm\"\n"),
            "FILE:2: data.objective must be one of \"lm\", \"masked_lm\", \"span_corruption\", got \"mlm\" (did you "
            "mean \"lm\"?)");
  EXPECT_EQ(error_of("[data]\nmask_fraction = 0.0\n"), "FILE:2: data.mask_fraction must be a number in (0, 1], got 0.0");
  EXPECT_EQ(error_of("[data]\nnoise_density = 1\n"), "FILE:2: data.noise_density must be a number in (0, 1), got 1.0");
  EXPECT_EQ(error_of("[data]\nmean_span_length = 0.5\n"),
            "FILE:2: data.mean_span_length must be a number ≥ 1, got 0.5");
  // A key of one objective in a recipe of another.
  EXPECT_EQ(error_of("[data]\nmask_fraction = 0.2\n"),
            "FILE:2: data.mask_fraction = 0.2 is read only for data.objective = \"masked_lm\"; data.objective = \"lm\" "
            "does not use it: leave it out");
  EXPECT_EQ(error_of("[data]\nobjective = \"span_corruption\"\nnext_sentence = true\n"),
            "FILE:3: data.next_sentence = true is read only for data.objective = \"masked_lm\"; data.objective = "
            "\"span_corruption\" does not use it: leave it out");
  EXPECT_EQ(error_of("", {"data.objective=masked_lm", "data.mean_span_length=5"}),
            "--set data.mean_span_length=5: data.mean_span_length = 5.0 is read only for data.objective = "
            "\"span_corruption\"; data.objective = \"masked_lm\" does not use it: leave it out");
  EXPECT_EQ(error_of("[data]\nnoise_density = 0.3\n"),
            "FILE:2: data.noise_density = 0.3 is read only for data.objective = \"span_corruption\"; data.objective = "
            "\"lm\" does not use it: leave it out");
  // At their defaults, as a resolved recipe writes them, the keys of other objectives are no error.
  EXPECT_EQ(load_ok("[data]\nmask_fraction = 0.15\nnext_sentence = false\nnoise_density = 0.15\n"
                    "mean_span_length = 3.0\n").data.objective,
            "lm");
  EXPECT_EQ(error_of("[data]\nsource = \"copy\"\nobjective = \"masked_lm\"\n"),
            "FILE:3: data.objective = \"masked_lm\" makes its rows from text (data.source = \"text\" or \"shards\"); "
            "data.source = \"copy\" is a synthetic task with inputs and targets of its own");
  EXPECT_EQ(error_of("[data]\nobjective = \"masked_lm\"\n[train]\nseq_len = 4\n"),
            "FILE:4: data.objective = \"masked_lm\" needs train.seq_len ≥ 5 ([CLS] A [SEP] B [SEP] with a token "
            "each); train.seq_len = 4 is shorter");
  EXPECT_EQ(error_of("[data]\nobjective = \"span_corruption\"\n[eval]\nseq_len = [64, 2]\n"),
            "FILE:4: data.objective = \"span_corruption\" needs each eval.seq_len ≥ 3 (a kept token, a sentinel and "
            "[EOS]); eval.seq_len[1] = 2 is shorter");
  EXPECT_EQ(error_of("[data]\nobjective = \"span_corruption\"\n[model]\npositions = \"rope\"\n[eval]\nseq_len = 512\n"),
            "FILE:6: eval.seq_len[0] = 512 is longer than train.seq_len = 256: data.objective = \"span_corruption\" "
            "has sentinels for the noise spans of rows up to train.seq_len only");
  EXPECT_EQ(error_of("[data]\nobjective = \"masked_lm\"\n[parallel]\nsp = 2\n"),
            "FILE:4: parallel.sp = 2 splits windows of the token stream; data.objective = \"masked_lm\" makes padded "
            "rows of its own: leave parallel.sp at 1 (--nproc still trains data-parallel)");

  Recipe mlm = load_ok("[model]\narch = \"encoder\"\nsegments = 2\n"
                       "[data]\nobjective = \"masked_lm\"\nmask_fraction = 0.2\nnext_sentence = true\n"
                       "[train]\nseq_len = 6\n[eval]\nseq_len = [5, 6]\n");
  EXPECT_EQ(mlm.data.mask_fraction, 0.2);
  EXPECT_TRUE(masked_lm_config(mlm).next_sentence);
  EXPECT_EQ(data_objective(mlm), Objective::masked_lm);
  EXPECT_EQ(objective_special_tokens(mlm), special_tokens(Objective::masked_lm));
  Recipe t5 = load_ok("[model]\narch = \"encoder_decoder\"\n"
                      "[data]\nobjective = \"span_corruption\"\nnoise_density = 0.15\nmean_span_length = 3\n"
                      "[train]\nseq_len = 512\n[eval]\nseq_len = [128, 512]\n");
  EXPECT_EQ(span_corruption_config(t5).mean_span_length, 3.0);
  EXPECT_EQ(objective_special_tokens(t5), special_tokens(Objective::span_corruption, 28));  // T5's 512: 28 spans
  EXPECT_EQ(objective_special_tokens(Recipe()), special_tokens(Objective::lm));
  // The objective and the model kind go together; the masked-LM rows need segments A and B.
  EXPECT_EQ(error_of("[data]\nobjective = \"masked_lm\"\n"),
            "FILE:2: data.objective = \"masked_lm\" trains model.arch = \"encoder\", but model.arch = \"decoder\"");
  EXPECT_EQ(error_of("[model]\narch = \"encoder\"\n"),
            "FILE:2: data.objective = \"lm\" trains model.arch = \"decoder\", but model.arch = \"encoder\"");
  EXPECT_EQ(error_of("[model]\narch = \"encoder\"\n[data]\nobjective = \"masked_lm\"\n"),
            "FILE:4: data.objective = \"masked_lm\" gives each token the segment of its sentence (A: 0, B: 1): "
            "model.segments must be at least 2, got 0");
  EXPECT_EQ(error_of("[model]\narch = \"encoder\"\nmixer = \"gla\"\nsegments = 2\n[data]\nobjective = \"masked_lm\"\n"),
            "FILE:3: model.arch = \"encoder\" needs bidirectional blocks, but mixer 'gla' is causal only (attention is "
            "bidirectional)");
}

// eval.seq_len: a list of lengths (one integer is a list of one), each checked and named by its index, in
// the file and in --set overrides; the model's context grows to the longest, and each length's batches
// hold about the tokens of train.seq_len's.
TEST_F(RecipeTest, EvalSeqLenIsAListOfLengths) {
  const std::string rope = "[model]\npositions = \"rope\"\n[train]\nseq_len = 256\nbatch_size = 8\n";
  Recipe r = load_ok(rope + "[eval]\nseq_len = [1024, 64, 256]\n");
  EXPECT_EQ(r.eval.seq_len, (std::vector<int64_t>{1024, 64, 256}));
  EXPECT_EQ(load_ok(rope + "[eval]\nseq_len = 512\n").eval.seq_len, (std::vector<int64_t>{512}));
  EXPECT_EQ(load_ok("eval.seq_len = []\n").eval.seq_len, (std::vector<int64_t>{}));

  EXPECT_EQ(error_of("[eval]\nseq_len = [64, 128, 0]\n"), "FILE:2: eval.seq_len[2] must be an integer ≥ 1, got 0");
  EXPECT_EQ(error_of("[eval]\nseq_len = -3\n"), "FILE:2: eval.seq_len[0] must be an integer ≥ 1, got -3");
  EXPECT_EQ(error_of("[eval]\nseq_len = [64, \"x\"]\n"),
            "FILE:2: eval.seq_len[1] must be an integer ≥ 1, got a string \"x\"");
  EXPECT_EQ(error_of("[eval]\nseq_len = [64, 1.5]\n"),
            "FILE:2: eval.seq_len[1] must be an integer ≥ 1, got a floating-point number 1.5");
  EXPECT_EQ(error_of("[eval]\nseq_len = \"long\"\n"),
            "FILE:2: eval.seq_len must be a list of integers ≥ 1, got a string \"long\"");
  EXPECT_EQ(error_of("[eval]\nseq_len = [64, 128, 64]\n"), "FILE:2: eval.seq_len[2] = 64 repeats eval.seq_len[0]");
  EXPECT_EQ(error_of("[eval]\nseqlen = [64]\n"), "FILE:2: unknown key eval.seqlen (did you mean eval.seq_len?)");

  // Learned positions have train.seq_len embeddings: shorter lengths go, longer ones are refused, wherever
  // the learned positions come from (here "auto" for an attention model).
  EXPECT_EQ(load_ok("[eval]\nseq_len = [64, 256]\n").eval.seq_len, (std::vector<int64_t>{64, 256}));
  const std::string learned =
      "eval.seq_len[1] = 1024 is longer than train.seq_len = 256: model.positions = \"learned\" has embeddings for "
      "256 positions only; score longer sequences with model.positions = \"rope\" or \"none\"";
  EXPECT_EQ(error_of("[eval]\nseq_len = [128, 1024]\n"), "FILE:2: " + learned);
  EXPECT_EQ(error_of("", {"eval.seq_len=[128,1024]"}), "--set eval.seq_len=[128,1024]: " + learned);
  EXPECT_EQ(load_ok("[model]\nmixer = \"gla\"\n[eval]\nseq_len = [4096]\n").eval.seq_len,
            (std::vector<int64_t>{4096}));  // no positions: any length

  // Overrides: a TOML list, one integer, the elements without brackets (no shell glob), or nothing.
  EXPECT_EQ(load_ok(rope, {"eval.seq_len=[256, 1024]"}).eval.seq_len, (std::vector<int64_t>{256, 1024}));
  EXPECT_EQ(load_ok(rope, {"eval.seq_len=512"}).eval.seq_len, (std::vector<int64_t>{512}));
  EXPECT_EQ(load_ok(rope, {"eval.seq_len=256,1024"}).eval.seq_len, (std::vector<int64_t>{256, 1024}));
  EXPECT_EQ(load_ok(rope + "[eval]\nseq_len = [512]\n", {"eval.seq_len="}).eval.seq_len, (std::vector<int64_t>{}));
  EXPECT_EQ(error_of(rope, {"eval.seq_len=[256,0]"}),
            "--set eval.seq_len=[256,0]: eval.seq_len[1] must be an integer ≥ 1, got 0");
  EXPECT_EQ(error_of(rope, {"eval.seq_len=long"}),
            "--set eval.seq_len=long: eval.seq_len must be a list of integers ≥ 1, got long");
  EXPECT_EQ(error_of(rope, {"eval.seq_len=[1,[2]]"}),
            "--set eval.seq_len=[1,[2]]: eval.seq_len[1] must be an integer ≥ 1, got an array");

  // The resolved recipe writes the list and loads back to it.
  const std::string text = resolved_recipe_toml(r);
  EXPECT_NE(text.find("\n[eval]\nseq_len = [1024, 64, 256]  # "), std::string::npos) << text;
  ASSERT_TRUE(write_resolved_recipe(r, dir_.string()).ok());
  absl::StatusOr<Recipe> again = load_recipe((dir_ / "recipe.toml").string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->eval.seq_len, r.eval.seq_len);
  EXPECT_EQ(resolved_recipe_toml(load_ok("")).find("seq_len = []"), resolved_recipe_toml(load_ok("")).find("\n[eval]\n") + 8);

  // The model reaches the longest length; a length's batches hold B·T / L sequences, at least one.
  EXPECT_EQ(longest_seq_len(r), 1024);
  EXPECT_EQ(model_config(r, 256)->max_seq_len, 1024);
  EXPECT_EQ(model_config(load_ok(rope), 256)->max_seq_len, 256);
  EXPECT_EQ(eval_batch_size(r, 256), 8);
  EXPECT_EQ(eval_batch_size(r, 1024), 2);
  EXPECT_EQ(eval_batch_size(r, 64), 32);
  EXPECT_EQ(eval_batch_size(r, 4096), 1);
  EXPECT_EQ(eval_batch_size(r, 300), 6);  // floor(2048 / 300)
  Recipe induction = r;
  induction.data.source = "induction";
  EXPECT_EQ(synthetic_config(induction, 1024).seq_len, 1024);
  EXPECT_EQ(synthetic_config(induction).seq_len, 256);
  EXPECT_EQ(loader_options(r, 64).seq_len, 64);
  EXPECT_EQ(loader_options(r).seq_len, 256);
}

// A warm-up longer than the run is cut to the run: `--set train.steps=20` tries a recipe that warms up for
// 30 without a second override, the learning rate reaching optim.lr at the last step.
TEST_F(RecipeTest, AWarmUpLongerThanTheRunIsCutToIt) {
  Recipe r = load_ok("[optim]\nwarmup_steps = 30\nlr = 0.01\n", {"train.steps=20"});
  const LrSchedule s = lr_schedule(r);
  EXPECT_EQ(s.warmup_steps, 20);
  EXPECT_DOUBLE_EQ(s.lr_at(19), 0.01);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.005);
  EXPECT_EQ(lr_schedule(load_ok("[optim]\nwarmup_steps = 30\n", {"train.steps=50"})).warmup_steps, 30);
}

TEST_F(RecipeTest, ResolvedRecipeReproducesTheRun) {
  absl::StatusOr<Recipe> first = load_recipe(
      std::string(SEQLAB_SOURCE_DIR) + "/recipes/gpt_small.toml",
      {"optim.lr=3e-4", "optim.eps=1.5e-9", "model.norm_eps=0.1", "log.sample_prompt=Say \"hi\"\n\tbye\\ é",
       "data.path=/tmp/a b", "model.mlp=swiglu", "train.seed=123456789012"});
  ASSERT_TRUE(first.ok()) << first.status();
  std::string text = resolved_recipe_toml(*first);
  // Every key is written, with its doc as a comment.
  EXPECT_NE(text.find("\n[train]\nsteps = 1000 "), std::string::npos) << text;
  size_t lr = text.find("\nlr = 3e-4 ");
  ASSERT_NE(lr, std::string::npos) << text;
  EXPECT_EQ(text.substr(lr, text.find('\n', lr + 1) - lr).rfind("  # peak learning rate"), text.find('\n', lr + 1) - lr - 22);
  EXPECT_NE(text.find("\nout_dir = \"runs/gpt_small\" "), std::string::npos) << text;

  // Loaded from a file of another name, it is the same run: same values, same run directory.
  ASSERT_TRUE(write_resolved_recipe(*first, dir_.string()).ok());
  EXPECT_EQ(slurp((dir_ / "recipe.toml").string()), text);
  absl::StatusOr<Recipe> second = load_recipe((dir_ / "recipe.toml").string());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->name, "recipe");
  EXPECT_EQ(second->run_dir(), "runs/gpt_small");
  EXPECT_EQ(second->optim.lr, 3e-4);
  EXPECT_EQ(second->optim.eps, 1.5e-9);
  EXPECT_EQ(second->model.norm_eps, 0.1);
  EXPECT_EQ(second->log.sample_prompt, "Say \"hi\"\n\tbye\\ é");
  EXPECT_EQ(second->data.path, "/tmp/a b");
  EXPECT_EQ(second->model.mlp, "swiglu");
  EXPECT_EQ(second->train.seed, 123456789012);
  Recipe renamed = *second;
  renamed.name = first->name;
  renamed.source_path = first->source_path;
  EXPECT_EQ(resolved_recipe_toml(renamed), text);
}

// recipe_differences names every key whose final value differs, with both values exactly as written,
// and nothing for a recipe and its resolved copy loaded from another file.
TEST_F(RecipeTest, DifferencesNameEveryKeyThatDiffers) {
  const Recipe a = load_ok("[optim]\nlr = 0.00012345678\n");
  EXPECT_TRUE(recipe_differences(a, a).empty());
  ASSERT_TRUE(write_resolved_recipe(a, dir_.string()).ok());
  absl::StatusOr<Recipe> copy = load_recipe((dir_ / "recipe.toml").string());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(recipe_differences(a, *copy).empty());

  // The 7th significant digit and beyond count; sub-table keys are keys too.
  const Recipe b = load_ok("[optim]\nlr = 0.00012345679\n[model.gla]\nchunk_size = 32\n", {"train.steps=7"});
  const std::vector<RecipeDifference> d = recipe_differences(a, b);
  ASSERT_EQ(d.size(), 3u);
  std::vector<std::string> keys;
  for (const RecipeDifference& x : d) keys.push_back(x.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"model.gla.chunk_size", "train.steps", "optim.lr"}));
  EXPECT_EQ(d[2].a, "0.00012345678");
  EXPECT_EQ(d[2].b, "0.00012345679");
  EXPECT_EQ(d[1].a, "1000");
  EXPECT_EQ(d[1].b, "7");
  // Ignored keys are left out.
  EXPECT_EQ(recipe_differences(a, b, {"train.steps", "model.gla.chunk_size"}).size(), 1u);
}

// model.norm, model.mlp, model.positions and model.bias default to "auto", which loading resolves from
// the model's mixers: GPT-2's choices when every block is attention, the recurrent models' otherwise.
// What a recipe sets stays.
TEST_F(RecipeTest, AutoSettingsFollowTheMixers) {
  Recipe gpt = load_ok("");
  EXPECT_EQ(gpt.model.norm, "layernorm");
  EXPECT_EQ(gpt.model.mlp, "gelu");
  EXPECT_EQ(gpt.model.positions, "learned");
  EXPECT_EQ(gpt.model.bias, true);
  for (const char* text : {"[model]\nmixer = \"gla\"\n", "[model]\npattern = \"gla attention\"\n"}) {
    Recipe r = load_ok(text);
    EXPECT_EQ(r.model.norm, "rmsnorm") << text;
    EXPECT_EQ(r.model.mlp, "swiglu") << text;
    EXPECT_EQ(r.model.positions, "none") << text;
    EXPECT_EQ(r.model.bias, false) << text;
  }
  Recipe chosen = load_ok("[model]\nmixer = \"gla\"\nnorm = \"layernorm\"\nmlp = \"gelu\"\nbias = true\n",
                          {"model.positions=learned"});
  EXPECT_EQ(chosen.model.norm, "layernorm");
  EXPECT_EQ(chosen.model.mlp, "gelu");
  EXPECT_EQ(chosen.model.positions, "learned");
  EXPECT_EQ(chosen.model.bias, true);
  EXPECT_EQ(load_ok("[model]\nbias = false\n", {"model.bias=auto"}).model.bias, true);
}

TEST_F(RecipeTest, MixerOptionsLiveInSubTables) {
  Recipe r = load_ok("[model]\nmixer = \"gla\"\n[model.gla]\nchunk_size = 32\ngate_rank = 8\n"
                     "[model.linear_attention]\nfeature_map = \"performer\"\n",
                     {"model.gla.gate_temperature=4", "model.delta_net.conv_size=2"});
  EXPECT_EQ(r.model.mixers.at("gla").integer("chunk_size"), 32);
  EXPECT_EQ(r.model.mixers.at("gla").integer("gate_rank"), 8);
  EXPECT_EQ(r.model.mixers.at("gla").number("gate_temperature"), 4.0);
  EXPECT_EQ(r.model.mixers.at("linear_attention").text("feature_map"), "performer");
  EXPECT_EQ(r.model.mixers.at("delta_net").integer("conv_size"), 2);
  EXPECT_EQ(r.model.mixers.at("retention").integer("chunk_size"), 64);  // untouched: its default
  EXPECT_FALSE(r.model.flat_mixer_keys);
  // Errors name the sub-table's key, with the same rules as any key.
  EXPECT_EQ(error_of("[model.gla]\nchunk_size = 0\n"), "FILE:2: model.gla.chunk_size must be an integer ≥ 1, got 0");
  EXPECT_EQ(error_of("[model.gla]\nchunk_sise = 16\n"),
            "FILE:2: unknown key model.gla.chunk_sise (did you mean model.gla.chunk_size?)");
  EXPECT_EQ(error_of("[model.gla]\nchunk = 16\n"),
            "FILE:2: unknown key model.gla.chunk ([model.gla] has chunk_size, gate_rank, gate_temperature)");
  EXPECT_EQ(error_of("[model.linear_attention]\nfeature_map = \"elu\"\n"),
            "FILE:2: model.linear_attention.feature_map must be one of \"elu+1\", \"relu\", \"identity\", "
            "\"performer\", got \"elu\" (did you mean \"relu\"?)");
  std::string tables;  // every mixer with options has its sub-table, by name
  for (const MixerSpec* m : registered_mixers()) {
    if (!m->options.empty()) tables += (tables.empty() ? "model." : ", model.") + m->name;
  }
  EXPECT_EQ(error_of("[model.nonesuch]\nd_state = 16\n"),
            "FILE:1: unknown section [model.nonesuch] ([model] has the sub-tables " + tables +
                ", model.moe: one per mixer, and the MoE FFN's)");
  EXPECT_EQ(error_of("", {"model.gla.chunksize=3"}),
            "--set model.gla.chunksize=3: unknown key model.gla.chunksize (did you mean model.gla.chunk_size?)");
  EXPECT_EQ(error_of("", {"model.glaa.chunk_size=3"}),
            "--set model.glaa.chunk_size=3: unknown section [model.glaa] (did you mean [model.gla]?)");
}

// Recipes of earlier versions: the older mixer names and arch, the older sub-table names, and the
// mixer options in [model], which set the option in every mixer that has it (a sub-table wins) and keep
// their old meaning: a recurrent model took the recurrent conventions whatever [model] said.
TEST_F(RecipeTest, OlderSpellingsStillLoad) {
  Recipe r = load_ok("[model]\narch = \"gpt\"\nmixer = \"retnet\"\nchunk_size = 16\nnorm = \"layernorm\"\n"
                     "mlp = \"gelu\"\nbias = true\npositions = \"learned\"\n[model.gla]\nchunk_size = 8\n");
  EXPECT_EQ(r.model.arch, "decoder");
  EXPECT_EQ(r.model.mixer, "retention");
  EXPECT_EQ(r.model.mixers.at("retention").integer("chunk_size"), 16);
  EXPECT_EQ(r.model.mixers.at("delta_net").integer("chunk_size"), 16);
  EXPECT_EQ(r.model.mixers.at("gla").integer("chunk_size"), 8);  // its sub-table wins
  EXPECT_TRUE(r.model.flat_mixer_keys);
  EXPECT_EQ(r.model.norm, "rmsnorm");
  EXPECT_EQ(r.model.mlp, "swiglu");
  EXPECT_EQ(r.model.bias, false);
  EXPECT_EQ(r.model.positions, "none");
  // An attention model kept [model]'s settings then and keeps them now.
  Recipe gpt = load_ok("[model]\nchunk_size = 16\nnorm = \"rmsnorm\"\nmlp = \"swiglu\"\nbias = false\n");
  EXPECT_EQ(gpt.model.norm, "rmsnorm");
  EXPECT_EQ(gpt.model.mlp, "swiglu");
  EXPECT_EQ(gpt.model.bias, false);
  EXPECT_EQ(gpt.model.positions, "learned");
  EXPECT_EQ(load_ok("[model.retnet]\nchunk_size = 4\n").model.mixers.at("retention").integer("chunk_size"), 4);
  EXPECT_EQ(load_ok("", {"model.linear.feature_count=7", "model.mixer=deltanet"}).model.mixer, "delta_net");
  // The resolved recipe uses only the current spellings, and loads back to the same run.
  const std::string text = resolved_recipe_toml(r);
  EXPECT_EQ(text.find("\nchunk_size = 16"), text.find("\n[model.retention]\nchunk_size = 16") + 18) << text;
  EXPECT_EQ(text.find("[model.gla]"), std::string::npos) << "only the mixers the model uses: " << text;
  EXPECT_NE(text.find("mixer = \"retention\""), std::string::npos);
  EXPECT_NE(text.find("arch = \"decoder\""), std::string::npos);
  ASSERT_TRUE(write_resolved_recipe(r, dir_.string()).ok());
  absl::StatusOr<Recipe> again = load_recipe((dir_ / "recipe.toml").string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->model.flat_mixer_keys);
  EXPECT_EQ(again->model.norm, "rmsnorm");
  EXPECT_EQ(again->model.mixers.at("retention"), r.model.mixers.at("retention"));
}

TEST_F(RecipeTest, PatternsListTheBlocks) {
  Recipe r = load_ok("[model]\nn_layers = 8\npattern = \"gla*3, attention:gelu\"\n");
  absl::StatusOr<std::vector<BlockSpec>> blocks = block_pattern(r.model);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_EQ(blocks->size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const bool attention = i % 4 == 3;
    EXPECT_EQ((*blocks)[i].mixer, attention ? "attention" : "gla") << i;
    EXPECT_EQ((*blocks)[i].ffn, attention ? FfnKind::gelu : FfnKind::swiglu) << i;  // model.mlp: auto → swiglu
  }
  Recipe plain = load_ok("[model]\nmixer = \"deltanet\"\nn_layers = 3\nmlp = \"none\"\n");
  EXPECT_EQ(*block_pattern(plain.model), (std::vector<BlockSpec>(3, BlockSpec{"delta_net", FfnKind::none})));
  EXPECT_EQ(error_of("[model]\npattern = \"gla attn\"\n"),
            "FILE:2: model.pattern: unknown mixer \"attn\" in \"attn\"; mixers: " + mixer_names());
  EXPECT_EQ(error_of("[model]\npattern = \"gla retnetx\"\n"),
            "FILE:2: model.pattern: unknown mixer \"retnetx\" in \"retnetx\" (did you mean \"retention\"?); mixers: " +
                mixer_names());
  EXPECT_EQ(error_of("[model]\npattern = \"gla:mixture\"\n"),
            "FILE:2: model.pattern: \"gla:mixture\" names the FFN \"mixture\"; the FFNs are gelu, swiglu, relu, geglu, "
            "moe, none");
  EXPECT_EQ(error_of("[model]\npattern = \"gla*0\"\n"), "FILE:2: model.pattern: \"gla*0\" must end in *N with N ≥ 1");
  EXPECT_EQ(error_of("[model]\npattern = \"gla gla attention\"\n"),
            "FILE:2: model.pattern has 3 blocks, which do not divide model.n_layers = 4 (a pattern repeats to fill "
            "n_layers)");
  EXPECT_EQ(error_of("[model]\npattern = \" , \"\n"), "FILE:2: model.pattern names no block");
}

// [model.moe] and model.shared_attention_every: read into the model's configuration, written into the
// resolved recipe only where a block uses them, refused where they cannot run.
TEST_F(RecipeTest, MixtureOfExpertsAndSharedAttention) {
  const Recipe r = load_ok(
      "[model]\npattern = \"gla gla:moe\"\nshared_attention_every = 2\n[model.moe]\nexperts = 6\ntop_k = 1\n"
      "capacity_factor = 0\nexpert = \"gelu\"\nd_ff = 96\naux_loss_weight = 0.05\nrouter_weights = \"softmax\"\n");
  const ModelConfig c = *model_config(r, 256);
  EXPECT_EQ(c.blocks[1], (BlockSpec{"gla", FfnKind::moe}));
  EXPECT_EQ(c.blocks[0], (BlockSpec{"gla", FfnKind::swiglu}));
  EXPECT_EQ(c.moe.experts, 6);
  EXPECT_EQ(c.moe.top_k, 1);
  EXPECT_EQ(c.moe.capacity_factor, 0.0);
  EXPECT_EQ(c.moe.expert, FfnKind::gelu);
  EXPECT_EQ(c.moe.d_ff, 96);
  EXPECT_EQ(c.moe.aux_loss_weight, 0.05);
  EXPECT_FALSE(c.moe.renormalize);
  EXPECT_EQ(c.shared_attention_every, 2);
  EXPECT_EQ(c.shared_attention_ffn, FfnKind::swiglu);
  const std::string resolved = resolved_recipe_toml(r);
  EXPECT_NE(resolved.find("[model.moe]\nexperts = 6"), std::string::npos);
  EXPECT_NE(resolved.find("\n[model.attention]\n"), std::string::npos);  // the shared block's options
  // It reads back to the same recipe.
  absl::StatusOr<Recipe> again = load_recipe_text(resolved, put("", "again.toml"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(recipe_differences(r, *again, {"log.out_dir"}).empty());
  // Without an MoE block or the shared block: neither section is written.
  const std::string plain = resolved_recipe_toml(load_ok("[model]\nmixer = \"gla\"\n"));
  EXPECT_EQ(plain.find("\n[model.moe]\n"), std::string::npos);
  EXPECT_EQ(plain.find("\n[model.attention]\n"), std::string::npos);
  // Patterns with the SSM mixers, Jamba's layer: MoE FFNs in every other block.
  const ModelConfig jamba = *model_config(
      load_ok("[model]\nn_layers = 8\npattern = \"mamba*3, attention:moe, mamba:moe mamba mamba:moe mamba\"\n"), 256);
  EXPECT_EQ(jamba.blocks[0], (BlockSpec{"mamba", FfnKind::swiglu}));
  EXPECT_EQ(jamba.blocks[3], (BlockSpec{"attention", FfnKind::moe}));
  EXPECT_EQ(jamba.blocks[6], (BlockSpec{"mamba", FfnKind::moe}));
  EXPECT_EQ(jamba.blocks[7], (BlockSpec{"mamba", FfnKind::swiglu}));
  // Every block's FFN an MoE.
  EXPECT_EQ(model_config(load_ok("[model]\nmixer = \"gla\"\nmlp = \"moe\"\n"), 256)->blocks[3].ffn, FfnKind::moe);
  EXPECT_EQ(error_of("[model]\nmlp = \"moe\"\n[model.moe]\nexperts = 2\ntop_k = 3\n"),
            "FILE:5: model.moe.top_k = 3 must be at most model.moe.experts = 2");
  EXPECT_EQ(error_of("[model]\nmlp = \"moe\"\n[parallel]\nsp = 2\n"),
            "FILE:2: a block with the MoE FFN trains with parallel.sp = 1 (data parallelism with --nproc works); "
            "parallel.sp = 2");
  EXPECT_EQ(error_of("[model]\nshared_attention_every = 2\narch = \"encoder\"\n[data]\nobjective = \"masked_lm\"\n"
                     "[model.attention]\n"),
            "FILE:2: model.shared_attention_every > 0 is built into model.arch = \"decoder\" only; model.arch = "
            "\"encoder\"");
}

// Every recipe of recipes/ loads and builds its model; the hybrid's blocks are what its pattern says.
TEST_F(RecipeTest, EveryRecipeOfTheRepositoryBuildsItsModel) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(std::string(SEQLAB_SOURCE_DIR) + "/recipes")) {
    if (entry.path().extension() != ".toml") continue;
    ++count;
    absl::StatusOr<Recipe> r = load_recipe(entry.path().string());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->model.flat_mixer_keys) << entry.path() << " uses the older flat mixer keys";
    absl::StatusOr<std::unique_ptr<LanguageModel>> model = build_model(*r, 256);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_GT((*model)->num_parameters(), 0);
    if (r->name == "hybrid_small") {
      const ModelConfig c = *model_config(*r, 256);
      ASSERT_EQ(c.blocks.size(), 4u);
      EXPECT_EQ(c.blocks[2], (BlockSpec{"attention", FfnKind::swiglu}));
      EXPECT_EQ(c.blocks[3], (BlockSpec{"gla", FfnKind::swiglu}));
      EXPECT_EQ(c.norm, NormKind::rms_norm);
      EXPECT_EQ(c.positions, PositionKind::none);
      EXPECT_EQ((*model)->max_context(), 256);
    }
  }
  EXPECT_GE(count, 6);
}

TEST_F(RecipeTest, DocsMatchTheSchema) {
  std::string doc = recipe_reference_markdown();
  EXPECT_EQ(slurp(std::string(SEQLAB_SOURCE_DIR) + "/docs/recipes.md"), doc)
      << "docs/recipes.md is stale: regenerate it with `seqlab recipe --doc > docs/recipes.md`";
  // A key's row: type, default, allowed range, meaning.
  EXPECT_NE(doc.find("| `steps` | integer | `1000` | ≥ 1 | optimizer steps |"), std::string::npos);
  EXPECT_NE(doc.find("| `schedule` | string | `\"cosine\"` | `\"cosine\"`, `\"linear\"`, `\"constant\"` |"),
            std::string::npos);
  EXPECT_NE(doc.find("| `val_fraction` | number | `0.05` | (0, 0.5] |"), std::string::npos);
  EXPECT_NE(doc.find("| `seq_len` | list of integers | `[]` | each ≥ 1 |"), std::string::npos);
  for (const char* section : {"model", "data", "train", "optim", "parallel", "log", "eval", "checkpoint"}) {
    EXPECT_NE(doc.find(std::string("\n## [") + section + "]\n"), std::string::npos) << section;
  }
  EXPECT_NE(doc.find("- model.n_heads divides model.d_model\n"), std::string::npos);
}

}  // namespace
}  // namespace seqlab
