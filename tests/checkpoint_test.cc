// Checkpoints across the redesign (train/checkpoint/checkpoint.h): a checkpoint written before the
// models were built from blocks ("seqlab-checkpoint 1", whose GPT named its parts ln1, attn, ln2, ln_f)
// is read under the current names — weights and optimizer state — and restores into the decoder the
// recipe builds; the run directory's old recipe (flat mixer keys, `arch = "gpt"`, explicit GPT-2
// settings beside a recurrent mixer) builds the model it built then. A checkpoint of another format is
// refused with a message naming the file and the formats read.
//
// Checked checkpoints (format 3): a saved checkpoint carries a CRC32C of every tensor and of its
// metadata and passes its checks; 16 flipped bytes in a tensor's data, or one in the metadata, are
// refused by name, with the newest older checkpoint that passes its checks; a checkpoint that cannot
// be written leaves the older ones and no temporary file; weights that are not finite are never saved
// nor restored; checkpoints after a resumed one are set aside.
//
// Identity (issue 26): every checkpoint records its run's id, and a checkpoint of another run is refused
// naming both; a run from before ids is given one; a resumed run's recipe is its checkpoint's, named as
// the run was, and a damaged recipe.toml is refused; a refused run removes the folder its lock created.
#include "train/checkpoint/checkpoint.h"

#include <absl/strings/str_format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tensor/kernels.h"
#include "train/checkpoint/run_folder.h"
#include "train/common/errors.h"
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
  const ModelConfig c = *model_config(r, 256);
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
                                            "not \"seqlab-checkpoint 3\", \"seqlab-checkpoint 2\" or \"seqlab-checkpoint 1\")");
  }
}

// A small run's model and optimizer, as the training loop saves them.
struct SmallRun {
  explicit SmallRun(const fs::path& dir) {
    std::ofstream(dir / "recipe.toml") << "[model]\nd_model = 8\nn_layers = 1\nn_heads = 2\n[train]\nseq_len = 8\n";
    recipe = load_run_recipe(dir.string());
    model = *build_model(recipe, 16);
    optimizer = std::make_unique<Optimizer>(optim_config(recipe), model->parameters());
  }
  void save(const fs::path& dir, int64_t step, int64_t keep = 5) {
    save_checkpoint(dir.string(), step, *model, *optimizer, LoaderState{0, step}, recipe, keep);
  }
  Recipe recipe;
  std::unique_ptr<LanguageModel> model;
  std::unique_ptr<Optimizer> optimizer;
};

// The message of the UserError `f` throws, or "" when it throws none.
template <class F>
std::string user_error(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Flips `n` bytes of `file` at `offset` bytes into the data of tensor `name` (header untouched).
void flip_tensor_bytes(const std::string& file, const std::string& name, size_t offset, size_t n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const size_t entry = header.find("\"" + name + "\"");
  const size_t begin = header.find("\"data_offsets\":[", entry) + 16;
  const uint64_t at = 8 + header_len + std::stoull(header.substr(begin)) + offset;
  std::string bytes(n, '\0');
  f.seekg(static_cast<std::streamoff>(at));
  f.read(bytes.data(), static_cast<std::streamsize>(n));
  for (char& c : bytes) c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(n));
}

TEST_F(CheckpointTest, ASavedCheckpointCarriesChecksumsAndPassesThem) {
  SmallRun run(dir_);
  run.save(dir_, 4);
  const std::string file = (dir_ / "ckpt_0000004.safetensors").string();
  EXPECT_EQ(checkpoint_damage(file), "");
  const Checkpoint c = read_checkpoint(file);
  EXPECT_EQ(c.contents.metadata.at("format"), "seqlab-checkpoint 3");
  EXPECT_EQ(c.step, 4);
  EXPECT_EQ(c.loader.position, 4);
  // One checksum per tensor (weights and optimizer state), 8 hex digits, and one of the metadata.
  size_t sums = 0;
  for (const auto& [key, value] : c.contents.metadata) {
    if (key.rfind("crc32c.", 0) != 0) continue;
    ++sums;
    EXPECT_TRUE(c.contents.tensors.count(key.substr(7))) << key;
    EXPECT_EQ(value.size(), 8u) << key;
  }
  EXPECT_EQ(sums, c.contents.tensors.size());
  EXPECT_EQ(c.contents.metadata.at("crc32c").size(), 8u);
  // The checksums are CRC32C of the bytes the file stores.
  const SafetensorsChecksums on_disk = *read_safetensors_checksums(file);
  for (const auto& [name, crc] : on_disk.crc32c) {
    EXPECT_EQ(c.contents.metadata.at("crc32c." + name), absl::StrFormat("%08x", crc)) << name;
  }
}

TEST_F(CheckpointTest, FlippedBytesAreRefusedNamingTheTensorAndTheOlderIntactCheckpoint) {
  SmallRun run(dir_);
  run.save(dir_, 3);
  run.save(dir_, 6);
  const std::string older = (dir_ / "ckpt_0000003.safetensors").string();
  const std::string newer = (dir_ / "ckpt_0000006.safetensors").string();
  flip_tensor_bytes(newer, "blocks.0.mlp.fc.weight", 40, 16);

  const std::string error = user_error([&] { read_checkpoint(newer); });
  EXPECT_EQ(error.rfind(newer + ": damaged: tensor \"blocks.0.mlp.fc.weight\" fails its CRC32C check (stored ", 0), 0u)
      << error;
  EXPECT_NE(error.find("; the newest older checkpoint that passes its checks is " + older + " (use it with --checkpoint " +
                       older + ")"),
            std::string::npos)
      << error;
  EXPECT_NE(checkpoint_damage(newer), "");
  EXPECT_EQ(checkpoint_damage(older), "");
  EXPECT_EQ(read_checkpoint(older).step, 3);

  // The oldest one damaged too: no older checkpoint to offer.
  flip_tensor_bytes(older, "wte.weight", 0, 1);
  EXPECT_NE(user_error([&] { read_checkpoint(older); }).find("; there is no older checkpoint beside it"), std::string::npos);
  EXPECT_NE(user_error([&] { read_checkpoint(newer); }).find("; no older checkpoint beside it passes its checks"),
            std::string::npos);
}

TEST_F(CheckpointTest, AFlippedByteInTheMetadataIsRefused) {
  SmallRun run(dir_);
  run.save(dir_, 2);
  const std::string file = (dir_ / "ckpt_0000002.safetensors").string();
  // "d_model = 8" in the recipe the metadata holds becomes "d_model = 9": the JSON still parses.
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(16384, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  f.clear();  // a file shorter than the buffer sets eof
  const size_t at = head.find("d_model = 8");
  ASSERT_NE(at, std::string::npos);
  f.seekp(static_cast<std::streamoff>(at + 10));
  f.write("9", 1);
  f.close();
  const std::string error = user_error([&] { read_checkpoint(file); });
  EXPECT_NE(error.find(file + ": damaged: its metadata fails its CRC32C check"), std::string::npos) << error;
}

TEST_F(CheckpointTest, AFormat3CheckpointWithoutChecksumsIsRefused) {
  const std::string file = (dir_ / "ckpt_0000001.safetensors").string();
  ASSERT_TRUE(write_safetensors(file, {{"w", Tensor::ones({2})}},
                                {{"format", "seqlab-checkpoint 3"}, {"step", "1"}, {"vocab_size", "4"},
                                 {"loader_epoch", "0"}, {"loader_position", "0"}})
                  .ok());
  EXPECT_NE(user_error([&] { read_checkpoint(file); }).find("lacks the checksum 'crc32c' that format 3 requires"),
            std::string::npos);
  // Format 2 predates checksums: read without them.
  ASSERT_TRUE(write_safetensors(file, {{"w", Tensor::ones({2})}},
                                {{"format", "seqlab-checkpoint 2"}, {"step", "1"}, {"vocab_size", "4"},
                                 {"loader_epoch", "0"}, {"loader_position", "0"}})
                  .ok());
  EXPECT_EQ(read_checkpoint(file).step, 1);
  EXPECT_EQ(checkpoint_damage(file), "");
}

TEST_F(CheckpointTest, ACheckpointThatCannotBeWrittenLeavesTheOlderOnesAndNoTemporary) {
  SmallRun run(dir_);
  run.save(dir_, 3, 1);
  // A folder where the checkpoint of step 4 should go: its rename fails, as a full or read-only disk would fail it.
  fs::create_directories(dir_ / "ckpt_0000004.safetensors" / "x");
  const std::string error = user_error([&] { run.save(dir_, 4, 1); });
  EXPECT_EQ(error.rfind("the checkpoint of step 4 was not saved: ", 0), 0u) << error;
  EXPECT_NE(error.find("the checkpoints saved before are kept (the newest: " + (dir_ / "ckpt_0000003.safetensors").string()),
            std::string::npos)
      << error;
  EXPECT_EQ(checkpoint_damage((dir_ / "ckpt_0000003.safetensors").string()), "");
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  // Rotation runs only after a checkpoint was written and read back: keep = 1 leaves the newest.
  fs::remove_all(dir_ / "ckpt_0000004.safetensors");
  run.save(dir_, 5, 1);
  EXPECT_FALSE(fs::exists(dir_ / "ckpt_0000003.safetensors"));
  EXPECT_EQ(checkpoint_damage((dir_ / "ckpt_0000005.safetensors").string()), "");
}

TEST_F(CheckpointTest, WeightsThatAreNotFiniteAreNeitherSavedNorRestored) {
  SmallRun run(dir_);
  run.save(dir_, 1);
  Tensor& w = *run.model->parameters()[2].tensor;
  const std::string name = run.model->parameters()[2].name;
  w.data<float>()[0] = std::nanf("");
  const std::string error = user_error([&] { run.save(dir_, 2); });
  EXPECT_EQ(error, "the checkpoint of step 2 was not saved: the weight " + name +
                       " holds values that are not finite (NaN or inf); the checkpoints saved before are kept (the "
                       "newest: " + (dir_ / "ckpt_0000001.safetensors").string() + ")");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt_0000002.safetensors"));
  // A checkpoint of format 2 (no checksums) holding an inf is refused when restored.
  Checkpoint c = read_checkpoint((dir_ / "ckpt_0000001.safetensors").string());
  c.contents.tensors.at(name).data<float>()[1] = INFINITY;
  EXPECT_EQ(user_error([&] { restore_weights(c, *run.model); }),
            c.file + ": the weight " + name + " holds values that are not finite (NaN or inf)");
}

TEST_F(CheckpointTest, CheckpointsAfterAResumedOneAreSetAside) {
  SmallRun run(dir_);
  for (int64_t step : {2, 4, 6}) run.save(dir_, step);
  const std::vector<std::string> moved = set_aside_checkpoints_after(dir_.string(), 2);
  EXPECT_EQ(moved, (std::vector<std::string>{(dir_ / "ckpt_0000004.safetensors.abandoned").string(),
                                             (dir_ / "ckpt_0000006.safetensors.abandoned").string()}));
  EXPECT_EQ(newest_checkpoint(dir_.string()), (dir_ / "ckpt_0000002.safetensors").string());
}

// Every checkpoint records its run's identity, under the metadata's CRC32C; open_run_checkpoint takes the
// run's from run.json and refuses a checkpoint of another run, naming both.
TEST_F(CheckpointTest, ACheckpointCarriesItsRunsIdentity) {
  SmallRun run(dir_);
  const RunIdentity id = new_run_identity();
  ASSERT_EQ(id.id.size(), 32u);
  EXPECT_EQ(id.id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(new_run_identity().id, id.id);
  write_run_identity(dir_.string(), id);
  save_checkpoint(dir_.string(), 2, *run.model, *run.optimizer, LoaderState{0, 2}, run.recipe, 5, {}, id);
  const std::string file = (dir_ / "ckpt_0000002.safetensors").string();
  const Checkpoint c = read_checkpoint_metadata(file);
  EXPECT_EQ(c.run.id, id.id);
  EXPECT_EQ(c.run.started, id.started);
  EXPECT_TRUE(c.contents.tensors.empty());
  EXPECT_EQ(read_checkpoint(file).run.id, id.id);
  const RunCheckpoint opened = open_run_checkpoint(dir_.string(), "", {}, false);
  EXPECT_EQ(opened.identity.id, id.id);
  EXPECT_FALSE(opened.new_identity);

  const RunIdentity other = new_run_identity();
  write_run_identity(dir_.string(), other);
  const std::string message = user_error([&] { open_run_checkpoint(dir_.string(), file, {}, false); });
  EXPECT_NE(message.find("--checkpoint " + file + " belongs to another run: it is run " + id.id), std::string::npos)
      << message;
  EXPECT_NE(message.find(dir_.string() + " is run " + other.id), std::string::npos) << message;
  // Without run.json, the run is the one its newest checkpoint records.
  fs::remove(dir_ / "run.json");
  EXPECT_EQ(open_run_checkpoint(dir_.string(), "", {}, false).identity.id, id.id);
}

// A run whose checkpoints were written before identities (none in their metadata) still resumes, and is
// given a new identity then.
TEST_F(CheckpointTest, ARunFromBeforeIdentitiesIsGivenOne) {
  SmallRun run(dir_);
  run.save(dir_, 2);
  const RunCheckpoint opened = open_run_checkpoint(dir_.string(), "", {}, true);
  EXPECT_TRUE(opened.checkpoint.run.empty());
  EXPECT_TRUE(opened.new_identity);
  EXPECT_EQ(opened.identity.id.size(), 32u);
  EXPECT_FALSE(opened.checkpoint.contents.tensors.empty());
}

// The recipe of a resumed run is its checkpoint's, named as the run was; recipe.toml must agree with it.
TEST_F(CheckpointTest, TheRecipeComesFromTheCheckpointAndKeepsItsName) {
  SmallRun run(dir_);
  run.recipe.name = "tiny";
  run.save(dir_, 2);
  ASSERT_TRUE(write_resolved_recipe(run.recipe, dir_.string()).ok());
  EXPECT_EQ(load_run_recipe(dir_.string()).name, "tiny");
  const RunCheckpoint opened = open_run_checkpoint(dir_.string(), "", {"train.steps=77"}, false);
  EXPECT_EQ(opened.recipe.name, "tiny");
  EXPECT_EQ(opened.recipe.train.steps, 77);
  std::ofstream(dir_ / "recipe.toml", std::ios::app) << "\n[optim]\nlr = 0.5\n";  // a second [optim]: damaged
  EXPECT_NE(user_error([&] { open_run_checkpoint(dir_.string(), "", {}, false); }).find("recipe.toml is damaged"),
            std::string::npos);
}

// A refused run removes the run folder its lock created (and the parents created with it) when the folder
// holds nothing but the lock; a folder that existed, or one that holds a file, stays.
TEST_F(CheckpointTest, ARefusedRunLeavesNoFolderItCreated) {
  RunLock::acquire((dir_ / "new" / "run").string()).remove_if_unused();
  EXPECT_FALSE(fs::exists(dir_ / "new"));
  fs::create_directories(dir_ / "old");
  RunLock::acquire((dir_ / "old").string()).remove_if_unused();
  EXPECT_TRUE(fs::is_directory(dir_ / "old"));
  RunLock written = RunLock::acquire((dir_ / "written").string());
  std::ofstream(dir_ / "written" / "recipe.toml") << "[train]\n";
  written.remove_if_unused();
  EXPECT_TRUE(fs::exists(dir_ / "written" / "recipe.toml"));
}

}  // namespace
}  // namespace seqlab::cli
