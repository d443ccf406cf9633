// Checkpoint folders (train/checkpoint/checkpoint.h) as `./train --resume RUN` and `./train sample RUN`
// read them: the input is the newest checkpoint of a run folder whose recipe.toml is
// tests/fuzz/checkpoint_run.toml (a two-block hybrid of d_model 8 on a synthetic task, whose own
// checkpoints seed the corpus). The checkpoint is read (metadata, tensors), a model is built for its
// vocabulary as `sample` does, its weights, optimizer state and loader position restored as a resume
// does, and a few tokens sampled from the restored model.
#include "fuzz_util.h"
#include "source_dir.h"
#include "train/checkpoint/checkpoint.h"
#include "train/common/errors.h"
#include "train/loop/sampling.h"
#include "train/recipe/configs.h"

namespace {

namespace fs = std::filesystem;

struct Run {
  fs::path dir;
  seqlab::Recipe recipe;
  std::unique_ptr<seqlab::TokenLoader> loader;  // a stand-in stream for the loader position to land in
};

const Run& run() {
  static const Run r = [] {
    Run r;
    r.dir = seqlab::fuzz::scratch_dir() / "run";
    fs::create_directories(r.dir);
    fs::copy_file(fs::path(SEQLAB_SOURCE_DIR) / "tests/fuzz/checkpoint_run.toml", r.dir / "recipe.toml",
                  fs::copy_options::overwrite_existing);
    r.recipe = seqlab::cli::load_run_recipe(r.dir.string());
    std::vector<int32_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 11);
    const std::string shard = (seqlab::fuzz::scratch_dir() / "train_000000.bin").string();
    if (!seqlab::write_shard(shard, tokens).ok()) std::abort();
    r.loader = std::make_unique<seqlab::TokenLoader>(*seqlab::TokenLoader::open({shard}, seqlab::loader_options(r.recipe)));
    return r;
  }();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const Run& r = run();
  const std::string file = fuzz::write_scratch("run/" + cli::checkpoint_name(1),
                                               absl::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const cli::Checkpoint c = cli::read_checkpoint(cli::newest_checkpoint(r.dir.string()));
    FUZZ_CHECK(c.file == file, "newest_checkpoint found " + c.file);
    absl::StatusOr<std::unique_ptr<LanguageModel>> model = build_model(r.recipe, c.vocab_size);
    if (!model.ok()) return 0;
    cli::restore_weights(c, **model);
    Optimizer optimizer(optim_config(r.recipe), (*model)->parameters());
    if (!optimizer.load_state(c.contents.tensors).ok()) return 0;
    if (!r.loader->restore(c.loader).ok()) return 0;
    SamplingOptions options;
    options.tokens = 3;
    Generator gen(c.step);
    const std::vector<int32_t> ids = generate(**model, {0, 1}, options, gen);
    FUZZ_CHECK(ids.size() == 3, "generate gave " + std::to_string(ids.size()) + " ids");
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < (*model)->vocab_size(), "sampled id " + std::to_string(id));
  } catch (const cli::UserError&) {
    // A refused checkpoint: the answer a bad file should get (main prints it and exits with 2).
  } catch (const NonFiniteLogits&) {
    // Finite weights whose logits are not (huge values that overflow the forward): `sample` refuses them in
    // one line (exit 2), as it should (tests/fuzz/corpus/checkpoint/nan_logits.safetensors, found so).
  }
  return 0;
}
