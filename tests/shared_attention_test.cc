// Zamba's shared attention block (ModelConfig::shared_attention_every; layers/model/stack.h): the
// decoder's logits against a hand composition of its parts (blocks, the shared block at each use on its
// own projection of [stream, embeddings], the final norm, the tied head), parameter names and counts
// (the shared weights once, a projection per use; active parameters once per use), FLOPs and state
// size per use, decoding a prompt and then one token at a time with a cache per use against the full
// forward, float64 finite differences of the shared weights (summed over the uses) and of the per-use
// projections, and the configurations it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "model_gradcheck.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 11, kC = 8, kH = 2, kB = 2, kT = 7;

// Three blocks (GLA, attention, GLA), the shared block after every `every` blocks.
ModelConfig zamba(int64_t every, FfnKind shared_ffn = FfnKind::swiglu) {
  ModelConfig cfg;
  cfg.vocab_size = kV;
  cfg.d_model = kC;
  cfg.n_heads = kH;
  cfg.max_seq_len = 16;
  cfg.blocks = {{"gla", FfnKind::swiglu}, {"attention", FfnKind::none}, {"gla", FfnKind::gelu}};
  cfg.shared_attention_every = every;
  cfg.shared_attention_ffn = shared_ffn;
  cfg.init_std = 0.3;  // attention far from uniform, projections that matter
  MixerOptions gla(mixer_spec("gla").options);
  gla.set("chunk_size", int64_t{4});
  gla.set("gate_rank", int64_t{3});
  cfg.mixer_options["gla"] = gla;
  return cfg;
}

Tensor tokens(int64_t B, int64_t T) {
  std::vector<int64_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((7 * i + 3) % kV);
  return Tensor::from_indices(ids, {B, T});
}

double max_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  return d;
}

// Copies the decoder's parameters named prefix + name into `m`'s parameters `name`.
void copy_from(Module& m, Module& model, const std::string& prefix) {
  std::map<std::string, Tensor*> source;
  for (const Parameter& p : model.parameters()) source[p.name] = p.tensor;
  for (const Parameter& p : m.parameters()) {
    ASSERT_TRUE(source.count(prefix + p.name)) << prefix + p.name;
    *p.tensor = source[prefix + p.name]->detach();
  }
}

TEST(SharedAttention, LogitsEqualAHandComposition) {
  for (int64_t every : {1, 2}) {
    const ModelConfig cfg = resolved_config(zamba(every));
    Generator gen(4);
    Decoder model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    model.set_training(false);
    NoGradGuard no_grad;
    const Tensor ids = tokens(kB, kT);
    const Tensor logits = model.logits({ids});

    // The parts, built alone and given the decoder's weights.
    Generator scratch(99), drop(1);
    const MixerContext ctx = mixer_context_of(cfg);
    std::vector<std::unique_ptr<Block>> blocks;
    for (size_t i = 0; i < cfg.blocks.size(); ++i) {
      blocks.push_back(std::make_unique<Block>(cfg, cfg.blocks[i], ctx, false, scratch, drop));
      copy_from(*blocks.back(), model, "blocks." + std::to_string(i) + ".");
    }
    Block shared(cfg, BlockSpec{"attention", FfnKind::swiglu}, ctx, false, scratch, drop);
    copy_from(shared, model, "shared.");
    std::vector<std::unique_ptr<Linear>> in;
    for (int64_t u = 0; u < 3 / every; ++u) {
      in.push_back(std::make_unique<Linear>(2 * kC, kC, false, scratch));
      copy_from(*in.back(), model, "shared_in." + std::to_string(u) + ".");
    }
    Norm norm_f(cfg.norm, kC, cfg.norm_eps);
    copy_from(norm_f, model, "norm_f.");
    Embedding wte(kV, kC, scratch);
    copy_from(wte, model, "wte.");
    for (Module* m : std::initializer_list<Module*>{&shared, &norm_f, &wte}) m->set_training(false);
    for (auto& b : blocks) b->set_training(false);

    // x_0 = wte[ids]; after block i (every k-th): x = x + shared(W_u [x ; x_0]); logits = norm_f(x) wteᵀ.
    const Tensor x0 = wte.forward(ids);
    StackInput si;
    Tensor x = x0, branch;
    int64_t use = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto [s, b] = blocks[i]->forward(x, branch, si, nullptr);
      x = b.defined() ? add(s, b) : s;  // the whole stream
      branch = Tensor();
      if ((static_cast<int64_t>(i) + 1) % every != 0) continue;
      const Tensor z = in[static_cast<size_t>(use++)]->forward(concat({x, x0}, 2));
      auto [zs, zb] = shared.forward(z, Tensor(), si, nullptr);
      x = add(x, add(zs, zb));  // z + attention branch, + FFN branch
    }
    EXPECT_EQ(use, 3 / every);
    const Tensor want = linear(norm_f.forward(x), wte.weight());
    EXPECT_LE(max_diff(logits, want), 1e-12) << "every " << every;
    // The shared block changes the logits: the same weights without it differ.
    ModelConfig off = cfg;
    off.shared_attention_every = 0;
    Generator gen_off(4);
    Decoder plain(off, gen_off);
    plain.to(cpu_device(), DType::f64);
    plain.set_training(false);
    EXPECT_GT(max_diff(plain.logits({ids}), logits), 1e-3);
  }
}

TEST(SharedAttention, NamesCountsFlopsAndState) {
  const ModelConfig cfg = zamba(1);
  Generator gen(1);
  Decoder model(cfg, gen);
  std::vector<std::string> names;
  for (const Parameter& p : model.parameters()) names.push_back(p.name);
  for (const char* n : {"shared.norm1.weight", "shared.mixer.qkv.weight", "shared.mixer.proj.weight", "shared.norm2.weight",
                        "shared.mlp.gate.weight", "shared_in.0.weight", "shared_in.2.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  EXPECT_EQ(std::find(names.begin(), names.end(), "shared_in.3.weight"), names.end());
  // The shared weights once: the model without it, plus one block's weights and 3 projections of 2C·C.
  ModelConfig off = cfg;
  off.shared_attention_every = 0;
  Generator gen_off(1);
  Decoder plain(off, gen_off);
  const double block = block_parameter_count(resolved_config(cfg), BlockSpec{"attention", FfnKind::swiglu}, false);
  EXPECT_EQ(static_cast<double>(model.num_parameters()), static_cast<double>(plain.num_parameters()) + block + 3 * 2 * kC * kC);
  EXPECT_EQ(model_parameter_count(cfg), static_cast<double>(model.num_parameters()));
  EXPECT_EQ(model_parameter_count(zamba(2)), model_parameter_count(cfg) - 2 * 2 * kC * kC);  // one use
  // A token passes through the shared weights at each of the 3 uses.
  EXPECT_EQ(model_active_parameter_count(cfg), model_parameter_count(cfg) + 2 * block);
  // Attention's mixing FLOPs and KV cache once per use.
  const MixerSpec& attention = mixer_spec("attention");
  const MixerContext ctx = mixer_context_of(resolved_config(cfg));
  const MixerOptions opts = options_of(cfg, attention);
  EXPECT_NEAR(model_mixing_flops_per_token(cfg, 12) - model_mixing_flops_per_token(off, 12),
              3 * attention.mixing_flops_per_token(ctx, opts, 12), 1e-9);
  EXPECT_NEAR(model_state_size(cfg, 12) - model_state_size(off, 12), 3 * attention.state_size(ctx, opts, 12), 1e-9);
  // A stack of recurrences with the shared block has a bounded context (its caches grow).
  ModelConfig gla_only = cfg;
  gla_only.blocks = {{"gla", FfnKind::swiglu}, {"gla", FfnKind::swiglu}};
  Generator gen3(1);
  EXPECT_EQ(Decoder(gla_only, gen3).max_context(), 16);
}

// A prompt, then one token at a time, each use of the shared block continuing its own cache.
TEST(SharedAttention, DecodingEqualsTheFullForward) {
  for (int64_t every : {1, 3}) {
    Generator gen(3);
    Decoder model(zamba(every), gen);
    model.to(cpu_device(), DType::f64);
    model.set_training(false);
    NoGradGuard no_grad;
    const Tensor all = tokens(kB, 9);
    const Tensor full = model.logits({all});
    std::unique_ptr<DecodeState> state = model.new_decode_state();
    std::vector<Tensor> parts = {model.forward_step(narrow(all, 1, 0, 5), *state)};
    for (int64_t t = 5; t < 9; ++t) parts.push_back(model.forward_step(narrow(all, 1, t, 1), *state));
    EXPECT_LE(max_diff(concat(parts, 1), full), 1e-12) << "every " << every;
    const auto& states = dynamic_cast<DecoderState&>(*state).blocks;
    ASSERT_EQ(states.size(), 3u + static_cast<size_t>(3 / every));  // the blocks', then one per use
    double size = 0;
    for (const BlockState& s : states) size += s.mixer->size();
    EXPECT_EQ(size, model_state_size(zamba(every), 9)) << "every " << every;
  }
}

// The shared weights' gradient sums its uses; each projection's is its own use's.
TEST(SharedAttention, GradientsMatchFiniteDifferencesF64) {
  Generator gen(5);
  Decoder model(zamba(1), gen);
  model.to(cpu_device(), DType::f64);
  model.set_training(true);
  const Tensor ids = tokens(kB, 6);
  expect_parameter_gradients_match(
      model, [&] { return model.loss({ids, ids}); },
      {{"shared.mixer.qkv.weight", {0, 17, 100, 191}},
       {"shared.mixer.proj.weight", {5, 40}},
       {"shared.norm1.weight", {0, 3, 7}},
       {"shared.mlp.gate.weight", {0, 200}},
       {"shared_in.0.weight", {0, 9, 127}},
       {"shared_in.1.weight", {3, 64}},
       {"shared_in.2.weight", {8, 120}},
       {"wte.weight", {0, 13, 50}},
       {"blocks.0.mixer.q.weight", {1, 30}}},
      "zamba every 1");
}

TEST(SharedAttention, RefusesWhatItCannotBuild) {
  auto message = [](ModelConfig cfg) {
    try {
      Generator gen(1);
      make_model(cfg, gen);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(zamba(4)).find("shared_attention_every = 4 is more than the 3 blocks"), std::string::npos)
      << message(zamba(4));
  ModelConfig post = zamba(1);
  post.norm_placement = NormPlacement::post;
  EXPECT_NE(message(post).find("pre-norm decoder models only"), std::string::npos) << message(post);
  ModelConfig encoder = zamba(1);
  encoder.kind = ModelKind::encoder;
  encoder.blocks = {{"attention", FfnKind::gelu}};
  EXPECT_NE(message(encoder).find("pre-norm decoder models only"), std::string::npos) << message(encoder);
}

}  // namespace
}  // namespace seqlab
