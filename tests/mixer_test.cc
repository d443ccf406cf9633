// The mixer registry (layers/mixer.h): every mixer registered under its name with a doc page, a
// fused op room, tests and a recipe value that agree; older names resolve to the current ones; a
// name registered twice, an unknown name and an option of the wrong type are refused with messages
// that say what is wrong; MixerOptions hold a spec's defaults and take its typed values; every
// mixer's parameter_count equals the weights its built mixer has, at any sizes and options.
#include "layers/mixer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "source_dir.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = SEQLAB_SOURCE_DIR;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// `call` throws std::invalid_argument whose message starts with `start`.
template <class F>
void expect_refused(F call, const std::string& start) {
  try {
    call();
    ADD_FAILURE() << "no error; expected: " << start;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(start, 0), 0u) << e.what();
  }
}

// Every mixer of the source tree is in the registry: each MixerRegistration of src/layers/*/*_mixer.cpp
// (one per registered name), and mixer_names() lists them in order.
TEST(MixerRegistry, TheMixersOfThisBuild) {
  size_t registrations = 0;
  for (const auto& family : fs::directory_iterator(kSource / "src" / "layers")) {
    if (!family.is_directory()) continue;
    for (const auto& file : fs::directory_iterator(family.path())) {
      const std::string name = file.path().filename().string();
      if (name.size() < 10 || name.compare(name.size() - 10, 10, "_mixer.cpp") != 0) continue;
      std::ifstream in(file.path());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (size_t at = text.find("MixerRegistration k"); at != std::string::npos;
           at = text.find("MixerRegistration k", at + 1)) {
        ++registrations;
      }
    }
  }
  EXPECT_EQ(registered_mixers().size(), registrations);
  std::string names;
  for (const MixerSpec* m : registered_mixers()) names += (names.empty() ? "" : ", ") + m->name;
  EXPECT_EQ(mixer_names(), names);
  EXPECT_NE(find_mixer("attention"), nullptr);  // the one mixer the GPT recipes need
}

// The op room a doc page documents: the first `Code: `src/layers/<family>/<room>.` of the page — its
// own name for most (gla.md: the gla op), another where the op has a name of its own (mamba.md: the
// selective_scan op); "" when the page has no such line.
std::string room_of_page(const fs::path& page) {
  std::ifstream in(page);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string code = "Code: `src/layers/";
  const size_t at = text.find(code);
  if (at == std::string::npos) return "";
  const size_t family_end = text.find('/', at + code.size());
  if (family_end == std::string::npos) return "";
  const size_t room_end = text.find('.', family_end + 1);
  return room_end == std::string::npos ? "" : text.substr(family_end + 1, room_end - family_end - 1);
}

// One vocabulary: a mixer's doc page is docs/variants/<mixer>.md and names its op room, which has the op
// of that name in the op runner, its header in a family folder of src/layers, its CPU test
// tests/<room>_test.cc, its GPU test tests/<room>_gpu_test.cc and its CUDA kernels in the same family
// folder of src/cuda. (Gated DeltaNet is the delta_net op with a gate, on delta_net's page.)
TEST(MixerRegistry, NamesAgreeFromOpToDocPage) {
  for (const MixerSpec* m : registered_mixers()) {
    ASSERT_EQ(m->doc.rfind("docs/variants/", 0), 0u) << m->name << ": " << m->doc;
    EXPECT_TRUE(fs::is_regular_file(kSource / m->doc)) << m->name << ": no " << m->doc;
    if (m->name != "gated_delta_net") {
      EXPECT_EQ(fs::path(m->doc).stem().string(), m->name);
    }
    const std::string room = room_of_page(kSource / m->doc);
    EXPECT_FALSE(room.empty()) << m->doc << ": no line `Code: `src/layers/<family>/<room>...` naming its op";
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
  EXPECT_EQ(find_mixer("hyena"), nullptr);
  try {
    mixer_spec("hyena");
    ADD_FAILURE() << "no error for an unknown mixer";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "unknown mixer 'hyena' (mixers: " + mixer_names() + ")");
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
        const double v = std::get<double>(s.default_value);
        EXPECT_TRUE(s.min_open ? v > s.min : v >= s.min) << m->name << "." << s.key;
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
    MixerInput in;
    in.x = x;
    EXPECT_EQ(mixer->forward(in, nullptr).shape(), (Shape{2, 5, 8})) << m->name;
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
        // Another value inside the option's range: 3 above the default, or below where that passes
        // the maximum (a short convolution's 4 taps).
        const int64_t def = std::get<int64_t>(o.default_value);
        changed.set(o.key, static_cast<double>(def + 3) <= o.max ? def + 3
                                                                 : std::max(static_cast<int64_t>(o.min), def - 3));
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

// state_size counts what decoding carries: every mixer run on a prompt of T tokens with the state of its
// new_state() keeps exactly that many elements per sequence (recurrent state, normaliser, convolution
// tail, KV cache), as the state counts itself, for each choice of each of its text options.
TEST(MixerRegistry, StateSizeIsWhatDecodingCarries) {
  MixerContext ctx;
  ctx.d_model = 16;
  ctx.n_heads = 4;
  ctx.n_kv_heads = 2;
  for (const MixerSpec* m : registered_mixers()) {
    ASSERT_TRUE(m->state_size) << m->name << " has no state_size";
    std::vector<MixerOptions> variants = {MixerOptions(m->options)};
    for (const OptionSpec& o : m->options) {
      for (size_t c = 1; c < o.choices.size(); ++c) {
        MixerOptions other(m->options);
        other.set(o.key, o.choices[c]);
        variants.push_back(other);
      }
    }
    for (const MixerOptions& opts : variants) {
      Generator gen(2);
      std::unique_ptr<Mixer> mixer = m->make(ctx, opts, gen);
      for (int64_t B : {int64_t{1}, int64_t{3}}) {
        for (int64_t T : {int64_t{5}, int64_t{12}}) {
          std::unique_ptr<MixerState> state = mixer->new_state();
          EXPECT_EQ(state->size(), 0.0) << m->name;
          Generator data(3);
          MixerInput in;
          in.x = Tensor::randn({B, T, ctx.d_model}, data);
          mixer->forward(in, state.get());
          EXPECT_EQ(m->state_size(ctx, opts, T), state->size()) << m->name << " B " << B << " T " << T;
        }
      }
    }
  }
}

// What MixerTraits declare is what a mixer does: bidirectional mixers let a token see later tokens
// (and causal ones refuse causal = false), cross-attention mixers attend to a memory and only then,
// and a mixer refuses a bias, a memory or a direction it does not declare, in one message naming it.
TEST(MixerRegistry, TraitsAreWhatTheMixerDoes) {
  MixerContext ctx;
  ctx.d_model = 8;
  ctx.n_heads = 2;
  ctx.n_kv_heads = 2;
  for (const MixerSpec* m : registered_mixers()) {
    Generator gen(4);
    std::unique_ptr<Mixer> mixer = m->make(ctx, MixerOptions(m->options), gen);
    mixer->to(cpu_device(), DType::f64);
    Generator data(5);
    MixerInput in;
    in.x = kernel::to_dtype(Tensor::randn({1, 6, 8}, data), DType::f64);
    MixerInput later = in;  // the same row with its last token changed
    later.x = kernel::clone(in.x);
    kernel::copy_(narrow(later.x, 1, 5, 1), kernel::to_dtype(Tensor::randn({1, 1, 8}, data), DType::f64));
    NoGradGuard no_grad;
    // Causal: the first five outputs do not see the sixth token.
    EXPECT_EQ(max_abs_diff(narrow(mixer->forward(in, nullptr), 1, 0, 5), narrow(mixer->forward(later, nullptr), 1, 0, 5)),
              0.0)
        << m->name;
    in.causal = later.causal = false;
    if (m->traits.bidirectional) {
      EXPECT_GT(max_abs_diff(narrow(mixer->forward(in, nullptr), 1, 0, 1), narrow(mixer->forward(later, nullptr), 1, 0, 1)),
                1e-9)
          << m->name << " is declared bidirectional, but its first token does not see the last";
    } else {
      expect_refused([&] { mixer->forward(in, nullptr); }, m->name + " is causal only");
    }
    in.causal = true;
    MixerInput with_memory = in;
    with_memory.memory = kernel::to_dtype(Tensor::randn({1, 4, 8}, data), DType::f64);
    if (m->traits.cross_attention) {
      MixerContext cross = ctx;
      cross.cross = true;
      cross.memory_dim = 6;
      Generator gen2(4);
      std::unique_ptr<Mixer> cross_mixer = m->make(cross, MixerOptions(m->options), gen2);
      EXPECT_EQ(m->parameter_count(cross, MixerOptions(m->options)), static_cast<double>(cross_mixer->num_parameters()))
          << m->name;
      cross_mixer->to(cpu_device(), DType::f64);
      with_memory.memory = kernel::to_dtype(Tensor::randn({1, 4, 6}, data), DType::f64);
      EXPECT_EQ(cross_mixer->forward(with_memory, nullptr).shape(), (Shape{1, 6, 8})) << m->name;
      EXPECT_THROW(cross_mixer->forward(in, nullptr), std::invalid_argument) << m->name << ": no memory given";
      EXPECT_THROW(mixer->forward(with_memory, nullptr), std::invalid_argument) << m->name << ": self layer, memory";
    } else {
      expect_refused([&] { mixer->forward(with_memory, nullptr); }, m->name + " cannot attend to a memory");
    }
    if (!m->traits.score_bias) {
      MixerInput with_bias = in;
      with_bias.bias = Tensor::zeros({1, 2, 6, 6}, DType::f64);
      expect_refused([&] { mixer->forward(with_bias, nullptr); }, m->name + " has no attention scores");
    }
  }
}

}  // namespace
}  // namespace seqlab
