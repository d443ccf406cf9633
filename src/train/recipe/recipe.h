// Recipes: one TOML file describes a whole run (docs/recipes.md is the reference for every key).
//
// The structs below are plain data, one per section. Their defaults, ranges, choices and docs live in
// a single schema table in recipe.cpp, which loading, validation, the resolved-recipe writer and the
// markdown reference all read, so a key added there is checked, written and documented at once.
// Nothing below src/train sees these structs: the trainer turns them into the layers' own configs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "layers/mixer.h"

namespace seqlab {

// The values of a default-constructed section are placeholders; a Recipe's constructor fills in the
// schema's defaults, so take sections from a Recipe. The keys of [model.<mixer>] sub-tables come from
// each mixer's registration (layers/mixer.h), so they are checked and documented like the others.
// [model.moe]: the mixture-of-experts FFN of the blocks whose FFN is moe (layers/model/moe.h).
struct RecipeMoe {
  int64_t experts = 0, top_k = 0, d_ff = 0;
  double capacity_factor = 0, aux_loss_weight = 0;
  std::string expert;          // the experts' FFN kind
  std::string router_weights;  // "renormalized" or "softmax"
};

struct RecipeModel {
  std::string arch, mixer;
  std::string pattern;     // per-layer mixers ("" : model.mixer everywhere); see block_pattern()
  int64_t vocab_size = 0;  // 0: from the tokenizer
  int64_t d_model = 0, n_layers = 0, n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: n_heads
  int64_t d_ff = 0;        // 0: derived from d_model per FFN kind
  // "auto" until load_recipe resolves them (decoder_conventions): then a concrete choice.
  std::string mlp, norm, positions, norm_placement;
  int64_t relative_buckets = 0, relative_max_distance = 0;  // positions = "relative" (T5)
  int64_t segments = 0;        // encoder: rows of the segment embedding
  int64_t decoder_layers = 0;  // encoder_decoder: blocks of the decoder stack; 0: n_layers
  std::optional<bool> bias;  // nullopt: "auto"
  double norm_eps = 0;
  double rope_base = 0;
  bool tie_embeddings = false;
  double dropout = 0, init_std = 0;
  int64_t shared_attention_every = 0;  // Zamba's shared attention block after every k-th block; 0: none
  RecipeMoe moe;
  // [model.<mixer>]: the options of every registered mixer, by mixer name (defaults where unset).
  std::map<std::string, MixerOptions> mixers;
  // The recipe set a mixer option with its older flat spelling in [model] (model.chunk_size, ...): it
  // was written for the separate GPT and recurrent models, whose recurrent blocks ignored model.norm,
  // model.mlp, model.bias and model.positions. load_recipe keeps that meaning.
  bool flat_mixer_keys = false;
};

struct RecipeData {
  std::string source, path, format, jsonl_field, tokenizer, tokenizer_path;
  std::string objective;                // "lm", "masked_lm" or "span_corruption" (train/data/special_tokens.h)
  double mask_fraction = 0;             // masked_lm
  bool next_sentence = false;           // masked_lm
  double noise_density = 0, mean_span_length = 0;  // span_corruption
  double val_fraction = 0;
  std::string cache_dir;
  int64_t vocab_size = 0;  // shards without meta.json; 0: the tokenizer file's, else GPT-2's 50257
  int64_t task_vocab = 0, task_num_pairs = 0, task_copy_len = 0;
  std::string task_mqar_layout;  // "packed" or "zoology" (synthetic.h)
  double task_mqar_power = 0;
};

struct RecipeTrain {
  int64_t steps = 0, batch_size = 0, seq_len = 0, seed = 0, grad_accum = 0;
  std::string device, dtype;
  std::string on_nonfinite;  // "stop" or "skip"
  int64_t max_skipped = 0;   // skip: consecutive skipped updates before the run stops
};

struct RecipeOptim {
  std::string name;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, momentum = 0;
  bool nesterov = false;
  double grad_clip = 0;  // 0: off
  std::string schedule;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0;
  bool decay_norms = false, decay_biases = false, decay_embeddings = false;
};

struct RecipeParallel {
  int64_t threads = 0;  // 0: all cores
  int64_t sp = 1;       // ranks sharing each sequence (sequence parallelism)
  bool overlap = true;  // average gradient buckets while the backward goes on
};

struct RecipeLog {
  int64_t every = 0, eval_every = 0, eval_batches = 0;
  int64_t sample_every = 0;  // 0: never
  int64_t sample_tokens = 0;
  std::string sample_prompt;
  double sample_temperature = 0;
  std::string progress;
  std::string out_dir;  // "": runs/<recipe name>; see Recipe::run_dir
};

struct RecipeEval {
  // Lengths to score the model at besides train.seq_len (metrics val_loss@L, ...); empty: none.
  std::vector<int64_t> seq_len;
};

struct RecipeCheckpoint {
  int64_t every = 0;  // 0: only at the end
  int64_t keep = 0;
  bool save_on_signal = false;
};

struct Recipe {
  Recipe();  // every key at its schema default

  std::string name;         // the recipe file's stem: runs/<name> is the default run directory
  std::string source_path;  // the file it was loaded from ("" for a default recipe)
  RecipeModel model;
  RecipeData data;
  RecipeTrain train;
  RecipeOptim optim;
  RecipeParallel parallel;
  RecipeLog log;
  RecipeEval eval;
  RecipeCheckpoint checkpoint;

  std::string run_dir() const { return log.out_dir.empty() ? "runs/" + name : log.out_dir; }
};

// Reads, validates and resolves a recipe; `overrides` are "section.key=value" strings (the text after
// each --set), applied in order after the file. An error is InvalidArgument (NotFound for a missing
// file) whose message is one line starting with "FILE:LINE:" or "--set ...:" and naming the key and
// what it allows.
absl::StatusOr<Recipe> load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from the recipe's TOML text (a checkpoint holds its run's resolved recipe); `path` names it in
// messages and becomes its name (stem) and source_path, as for a file of that path.
absl::StatusOr<Recipe> load_recipe_text(const std::string& text, const std::string& path,
                                        const std::vector<std::string>& overrides = {});
// The recipe name a resolved recipe's first line records (`# Recipe "NAME" resolved ...`, written by
// resolved_recipe_toml); "" for text that does not start that way. A run folder's recipe.toml and a
// checkpoint's recipe keep the run's name this way: their own stem is not it.
std::string resolved_recipe_name(const std::string& text);

// Every key with its final value, by section, each with its doc as a comment; log.out_dir is written
// as the run directory itself, so loading the text from anywhere reproduces the run.
std::string resolved_recipe_toml(const Recipe& recipe);

// A double as the resolved recipe writes it: the shortest text that reads back to the same bits, always a
// TOML float (0.00012345678, 3e-4, 1e+30, 1.0, inf, nan) — what --set takes to set exactly that value.
std::string toml_number(double x);

// Every key of the schema (the [model.<mixer>] options of every mixer included) with its final value as
// the resolved recipe writes it (exact: numbers round-trip), in that order; log.out_dir as the run
// directory it names.
std::vector<std::pair<std::string, std::string>> recipe_values(const Recipe& recipe);

// A key whose final value differs between two recipes: its name ("optim.lr") and each recipe's value as
// the resolved recipe writes it (exact: numbers round-trip).
struct RecipeDifference {
  std::string key, a, b;
};
// Every key of the schema (the [model.<mixer>] options of every mixer included) whose value differs
// between `a` and `b`, in the order the resolved recipe writes them; keys named in `ignored` are skipped.
// Empty when the two recipes would train the same run. Recipe::name and source_path are not keys.
std::vector<RecipeDifference> recipe_differences(const Recipe& a, const Recipe& b,
                                                 const std::vector<std::string>& ignored = {});

// Writes resolved_recipe_toml into DIR/recipe.toml atomically (temporary name, flush, rename).
absl::Status write_resolved_recipe(const Recipe& recipe, const std::string& dir);

// docs/recipes.md: how recipes, overrides and errors work, then a table of every key per section.
std::string recipe_reference_markdown();

}  // namespace seqlab
