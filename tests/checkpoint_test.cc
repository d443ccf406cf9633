// Checkpoints across the redesign (train/checkpoint/checkpoint.h): a checkpoint written before the
// models were built from blocks ("seqlab-checkpoint 1", whose GPT named its parts ln1, attn, ln2, ln_f)
// is read under the current names — weights and optimizer state — and restores into the decoder the
// recipe builds; the run directory's old recipe (flat mixer keys, `arch = "gpt"`, explicit GPT-2
// settings beside a recurrent mixer) builds the model it built then. A checkpoint of another format is
// refused with a message naming the file and the formats read.
#include "train/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tensor/kernels.h"
#include "train/cli/commands.h"
#include "train/recipe/configs.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("checkpoint_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The name a weight had in a format-1 checkpoint of the GPT model.
std::string before_blocks(std::string name) {
  for (const auto& [now, then] : std::vector<std::pair<std::string, std::string>>{
           {".norm1.", ".ln1."}, {".mixer.", ".attn."}, {".norm2.", ".ln2."}}) {
    const size_t at = name.find(now);
    if (at != std::string::npos) name.replace(at, now.size(), then);
  }
  if (name.rfind("norm_f.", 0) == 0) name = "ln_f." + name.substr(7);
  return name;
}

TEST(CheckpointNames, FormatOneNamesMapToTheDecoders) {
  EXPECT_EQ(current_tensor_name("blocks.3.ln1.weight"), "blocks.3.norm1.weight");
  EXPECT_EQ(current_tensor_name("blocks.0.attn.qkv.bias"), "blocks.0.mixer.qkv.bias");
  EXPECT_EQ(current_tensor_name("blocks.1.ln2.bias"), "blocks.1.norm2.bias");
  EXPECT_EQ(current_tensor_name("ln_f.weight"), "norm_f.weight");
  EXPECT_EQ(current_tensor_name("optim.exp_avg_sq.blocks.2.attn.proj.weight"),
            "optim.exp_avg_sq.blocks.2.mixer.proj.weight");
  // The recurrent models' names were already the decoder's.
  for (const char* same : {"wte.weight", "wpe.weight", "blocks.0.mixer.gate_up.bias", "blocks.1.mlp.fc.weight",
                           "norm_f.weight", "optim.step"}) {
    EXPECT_EQ(current_tensor_name(same), same);
  }
}

TEST_F(CheckpointTest, AGptCheckpointWrittenBeforeTheBlocksRestores) {
  // The GPT a gpt_small-like recipe of that time built, its weights saved under the old names.
  const std::string recipe = (dir_ / "recipe.toml").string();
  std::ofstream(recipe) << "[model]\narch = \"gpt\"\nmixer = \"attention\"\nd_model = 16\nn_layers = 2\nn_heads = 2\n"
                           "chunk_size = 64\ngate_rank = 16\nnorm = \"layernorm\"\nmlp = \"gelu\"\nbias = true\n"
                           "positions = \"learned\"\n[train]\nseq_len = 8\nseed = 3\n";
  Recipe r = load_run_recipe(dir_.string());
  std::unique_ptr<LanguageModel> original = *build_model(r, 256);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Parameter& p : original->parameters()) tensors.emplace_back(before_blocks(p.name), p.tensor->detach());
  tensors.emplace_back("optim.exp_avg.blocks.0.attn.qkv.weight", Tensor::ones({48, 16}));
  const std::string file = (dir_ / "ckpt_0000007.safetensors").string();
  ASSERT_TRUE(write_safetensors(file, tensors,
                                {{"format", "seqlab-checkpoint 1"}, {"step", "7"}, {"vocab_size", "256"},
                                 {"loader_epoch", "0"}, {"loader_position", "56"}})
                  .ok());
  ASSERT_EQ(tensors[2].first, "blocks.0.ln1.weight");  // wte, wpe, then the first block under its old names

  const Checkpoint c = read_checkpoint(file);
  EXPECT_EQ(c.step, 7);
  EXPECT_TRUE(c.contents.tensors.count("blocks.1.norm2.bias"));
  EXPECT_TRUE(c.contents.tensors.count("optim.exp_avg.blocks.0.mixer.qkv.weight"));
  EXPECT_FALSE(c.contents.tensors.count("ln_f.weight"));
  Recipe again = load_run_recipe(dir_.string(), {"train.seed=99"});
  std::unique_ptr<LanguageModel> restored = *build_model(again, c.vocab_size);
  // A model drawn from another seed, then overwritten by the checkpoint: the same weights.
  EXPECT_NE(restored->parameters()[0].tensor->to_doubles(), original->parameters()[0].tensor->to_doubles());
  restore_weights(c, *restored);
  std::vector<Parameter> a = original->parameters(), b = restored->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].tensor->to_doubles(), b[i].tensor->to_doubles()) << a[i].name;
  }
}

TEST_F(CheckpointTest, AnOldRecurrentRunsRecipeBuildsTheModelItBuilt) {
  // Resolved recipes of that time wrote every key: GPT-2 settings beside a recurrent mixer, which the
  // recurrent model ignored. Its checkpoint names are the decoder's.
  const std::string recipe = (dir_ / "recipe.toml").string();
  std::ofstream(recipe) << "[model]\narch = \"gpt\"\nmixer = \"gla\"\nd_model = 16\nn_layers = 2\nn_heads = 2\n"
                           "chunk_size = 8\ngate_rank = 4\ngate_temperature = 16.0\nconv_size = 4\n"
                           "feature_map = \"elu+1\"\nfeature_count = 64\nnorm = \"layernorm\"\nmlp = \"gelu\"\n"
                           "bias = true\npositions = \"learned\"\n[train]\nseq_len = 8\n";
  Recipe r = load_run_recipe(dir_.string());
  const DecoderConfig c = *decoder_config(r, 256);
  EXPECT_EQ(c.norm, NormKind::rms_norm);
  EXPECT_EQ(c.positions, PositionKind::none);
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(c.blocks, std::vector<BlockSpec>(2, BlockSpec{"gla", FfnKind::swiglu}));
  EXPECT_EQ(c.mixer_options.at("gla").integer("chunk_size"), 8);
  EXPECT_EQ(c.mixer_options.at("gla").integer("gate_rank"), 4);
}

TEST_F(CheckpointTest, AnotherFormatIsRefused) {
  const std::string file = (dir_ / "ckpt_0000001.safetensors").string();
  ASSERT_TRUE(write_safetensors(file, {{"w", Tensor::ones({2})}}, {{"format", "seqlab-checkpoint 9"}}).ok());
  try {
    read_checkpoint(file);
    ADD_FAILURE() << "a format-9 checkpoint was read";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), file + ": not a seqlab checkpoint (metadata 'format' is \"seqlab-checkpoint 9\", "
                                            "not \"seqlab-checkpoint 2\" or \"seqlab-checkpoint 1\")");
  }
}

}  // namespace
}  // namespace seqlab::cli
