// The mixer registry (layers/mixer.h): every mixer registered under its name with a doc page, a
// fused op room, tests and a recipe value that agree; older names resolve to the current ones; a
// name registered twice, an unknown name and an option of the wrong type are refused with messages
// that say what is wrong; MixerOptions hold a spec's defaults and take its typed values; every
// mixer's parameter_count equals the weights its built mixer has, at any sizes and options.
#include "layers/mixer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "autograd/op_registry.h"
#include "source_dir.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = SEQLAB_SOURCE_DIR;

TEST(MixerRegistry, TheMixersOfThisBuild) {
  std::set<std::string> names;
  for (const MixerSpec* m : registered_mixers()) names.insert(m->name);
  EXPECT_EQ(names, (std::set<std::string>{"attention", "delta_net", "gated_delta_net", "gla", "linear_attention",
                                          "retention"}));
  EXPECT_EQ(mixer_names(), "attention, delta_net, gated_delta_net, gla, linear_attention, retention");
}

// One vocabulary: a mixer's doc page docs/variants/<room>.md names its op room, which has the op of
// that name in the op runner, its header in a family folder of src/layers, its CPU test
// tests/<room>_test.cc, its GPU test tests/<room>_gpu_test.cc and its CUDA kernels in the same family
// folder of src/cuda. (Gated DeltaNet is the delta_net op with a gate.)
TEST(MixerRegistry, NamesAgreeFromOpToDocPage) {
  for (const MixerSpec* m : registered_mixers()) {
    ASSERT_EQ(m->doc.rfind("docs/variants/", 0), 0u) << m->name << ": " << m->doc;
    EXPECT_TRUE(fs::is_regular_file(kSource / m->doc)) << m->name << ": no " << m->doc;
    const std::string room = fs::path(m->doc).stem().string();
    if (m->name != "gated_delta_net") {
      EXPECT_EQ(room, m->name);
    }
    EXPECT_NE(find_op(room), nullptr) << m->name << ": no op '" << room << "' in the registry";
    EXPECT_TRUE(fs::is_regular_file(kSource / "tests" / (room + "_test.cc"))) << room;
    EXPECT_TRUE(fs::is_regular_file(kSource / "tests" / (room + "_gpu_test.cc"))) << room;
    bool header = false, kernels = false;
    for (const auto& family : fs::directory_iterator(kSource / "src" / "layers")) {
      if (!family.is_directory()) continue;
      const std::string folder = family.path().filename().string();
      if (fs::is_regular_file(family.path() / (room + ".h"))) {
        header = true;
        kernels = fs::is_regular_file(kSource / "src" / "cuda" / folder / (room + ".cu"));
      }
    }
    EXPECT_TRUE(header) << room << ": no src/layers/<family>/" << room << ".h";
    EXPECT_TRUE(kernels) << room << ": no src/cuda/<family>/" << room << ".cu beside its room";
  }
}

TEST(MixerRegistry, OlderNamesResolveToTheCurrentOnes) {
  EXPECT_EQ(mixer_spec("retnet").name, "retention");
  EXPECT_EQ(mixer_spec("linear").name, "linear_attention");
  EXPECT_EQ(mixer_spec("deltanet").name, "delta_net");
  EXPECT_EQ(mixer_spec("gated_deltanet").name, "gated_delta_net");
  EXPECT_EQ(find_mixer("gla"), &mixer_spec("gla"));
  EXPECT_EQ(find_mixer("mamba"), nullptr);
  try {
    mixer_spec("mamba");
    ADD_FAILURE() << "no error for an unknown mixer";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "unknown mixer 'mamba' (mixers: " + mixer_names() + ")");
  }
}

TEST(MixerRegistry, ANameOrAliasRegisteredTwiceIsRefused) {
  const MixerSpec& gla = mixer_spec("gla");
  MixerSpec copy = gla;
  EXPECT_THROW(register_mixer(copy), std::logic_error);
  copy.name = "gla_again";
  copy.aliases = {"retnet"};
  EXPECT_THROW(register_mixer(copy), std::logic_error);
  copy.aliases = {};
  copy.make = nullptr;
  EXPECT_THROW(register_mixer(copy), std::logic_error);  // no factory
  EXPECT_EQ(find_mixer("gla_again"), nullptr);
}

TEST(MixerRegistry, OptionsHoldDefaultsAndTypedValues) {
  const MixerSpec& gla = mixer_spec("gla");
  MixerOptions o(gla.options);
  EXPECT_EQ(o.integer("chunk_size"), 64);
  EXPECT_EQ(o.integer("gate_rank"), 16);
  EXPECT_EQ(o.number("gate_temperature"), 16.0);
  o.set("chunk_size", int64_t{32});
  EXPECT_EQ(o.integer("chunk_size"), 32);
  EXPECT_THROW(o.set("chunk_size", 32.0), std::invalid_argument);            // a number for an integer
  EXPECT_THROW(o.set("chunk", int64_t{32}), std::invalid_argument);          // not an option of gla
  EXPECT_THROW(o.integer("feature_map"), std::logic_error);                  // not in gla's spec
  MixerOptions linear(mixer_spec("linear_attention").options);
  EXPECT_EQ(linear.text("feature_map"), "elu+1");
  // Every option's default lies in its own range or choices.
  for (const MixerSpec* m : registered_mixers()) {
    for (const OptionSpec& s : m->options) {
      EXPECT_FALSE(s.doc.empty()) << m->name << "." << s.key;
      if (s.type == OptionType::integer) {
        EXPECT_GE(static_cast<double>(std::get<int64_t>(s.default_value)), s.min) << m->name << "." << s.key;
      } else if (s.type == OptionType::number) {
        EXPECT_GT(std::get<double>(s.default_value), s.min) << m->name << "." << s.key;
      } else if (s.type == OptionType::text) {
        EXPECT_EQ(std::get<std::string>(s.default_value), s.choices.front()) << m->name << "." << s.key;
      }
    }
  }
}

TEST(MixerRegistry, EveryMixerMapsTheStreamToItsOwnShape) {
  MixerContext ctx;
  ctx.d_model = 8;
  ctx.n_heads = 2;
  ctx.n_kv_heads = 2;
  for (const MixerSpec* m : registered_mixers()) {
    Generator gen(1);
    std::unique_ptr<Mixer> mixer = m->make(ctx, MixerOptions(m->options), gen);
    Tensor x = Tensor::randn({2, 5, 8}, gen);
    EXPECT_EQ(mixer->forward(x, nullptr).shape(), (Shape{2, 5, 8})) << m->name;
    EXPECT_GT(m->mixing_flops_per_token(ctx, MixerOptions(m->options), 5), 0.0) << m->name;
    EXPECT_FALSE(mixer->parameters().empty()) << m->name;
  }
  ctx.n_heads = 3;  // does not divide d_model
  for (const MixerSpec* m : registered_mixers()) {
    Generator gen(1);
    EXPECT_THROW(m->make(ctx, MixerOptions(m->options), gen), std::invalid_argument) << m->name;
  }
}

// The count that lets a recipe's sizes be checked before anything is allocated is the built mixer's,
// across sizes, heads (grouped-query attention too), biases and every integer option changed.
TEST(MixerRegistry, ParameterCountEqualsTheBuiltMixers) {
  struct Sizes {
    int64_t d, heads, kv_heads;
    bool bias;
  };
  for (const Sizes& z : {Sizes{8, 2, 2, false}, Sizes{12, 3, 1, true}, Sizes{16, 4, 2, true}, Sizes{24, 2, 2, false}}) {
    MixerContext ctx;
    ctx.d_model = z.d;
    ctx.n_heads = z.heads;
    ctx.n_kv_heads = z.kv_heads;
    ctx.bias = z.bias;
    for (const MixerSpec* m : registered_mixers()) {
      std::vector<MixerOptions> variants = {MixerOptions(m->options)};
      for (const OptionSpec& o : m->options) {
        if (o.type != OptionType::integer) continue;
        MixerOptions changed(m->options);
        changed.set(o.key, std::get<int64_t>(o.default_value) + 3);
        variants.push_back(changed);
      }
      for (const MixerOptions& opts : variants) {
        Generator gen(1);
        std::unique_ptr<Mixer> mixer = m->make(ctx, opts, gen);
        EXPECT_EQ(m->parameter_count(ctx, opts), static_cast<double>(mixer->num_parameters()))
            << m->name << " d " << z.d << " heads " << z.heads << "/" << z.kv_heads << " bias " << z.bias;
      }
    }
  }
}

// state_size counts what decoding carries: every mixer run on a prompt of T tokens with a MixerState keeps
// exactly that many elements per sequence (recurrent state, normaliser, convolution tail, KV cache).
TEST(MixerRegistry, StateSizeIsWhatDecodingCarries) {
  MixerContext ctx;
  ctx.d_model = 16;
  ctx.n_heads = 4;
  ctx.n_kv_heads = 2;
  for (const MixerSpec* m : registered_mixers()) {
    ASSERT_TRUE(m->state_size) << m->name << " has no state_size";
    std::vector<MixerOptions> variants = {MixerOptions(m->options)};
    if (m->name == "linear_attention") {
      MixerOptions performer(m->options);
      performer.set("feature_map", std::string("performer"));
      variants.push_back(performer);
    }
    for (const MixerOptions& opts : variants) {
      Generator gen(2);
      std::unique_ptr<Mixer> mixer = m->make(ctx, opts, gen);
      for (int64_t T : {int64_t{5}, int64_t{12}}) {
        MixerState state;
        Generator data(3);
        mixer->forward(Tensor::randn({1, T, ctx.d_model}, data), &state);
        double kept = 0;
        for (const Tensor* t : {&state.state, &state.normalizer, &state.conv, &state.keys, &state.values}) {
          if (t->defined()) kept += static_cast<double>(t->numel());
        }
        EXPECT_EQ(m->state_size(ctx, opts, T), kept) << m->name << " T " << T;
      }
    }
  }
}

}  // namespace
}  // namespace seqlab
