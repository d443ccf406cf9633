// The encoder-decoder (model.arch = "encoder_decoder"): T5. An encoder stack reads the source tokens in
// both directions; a causal decoder stack reads the target tokens and, in every block, cross-attends to
// the encoder's output.
//
//   m = encoder(wte[inputs])                        bidirectional, padded keys masked by lengths
//   y = decoder(wte[decoder_inputs], memory = m)    causal self-attention, then cross attention to m
//                                                   (keys past each row's source length masked)
//   logits = (y · d^−½) · wteᵀ                      tied, scaled as T5 (untied, T5 v1.1: y · lm_headᵀ)
// Positions as configured: T5's relative bias (one table per stack, bidirectional buckets in the
// encoder, causal in the decoder; cross attention has none), or absolute ones added to both inputs.
// The loss is the decoder's cross-entropy on decoder_targets within decoder_lengths.
//
// Decoding: encode() runs the encoder on the source once and keeps its output in the state; each
// forward_step then feeds decoder tokens, with the self-attention KV caches growing and the cross
// attention's keys and values computed from the memory once, at the first step.
//
// Initialisation: as every model's (N(0, init_std²) matrices), but the shared embedding wte starts at
// N(0, 1), T5's (kT5EmbeddingStd).
//
// Parameter names: wte.weight, wpe.weight (learned positions), encoder.* and decoder.* (each stack's:
// relative_bias.weight, blocks.{i}.* — the decoder's with cross_norm.*, cross.* — norm_f.*),
// lm_head.weight (untied).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "layers/basic.h"
#include "layers/model/language_model.h"
#include "layers/model/model_config.h"
#include "layers/model/stack.h"

namespace seqlab {

constexpr double kT5EmbeddingStd = 1.0;  // the shared embedding's initial standard deviation (T5's)

struct EncoderDecoderState : DecodeState {
  Tensor memory;          // [B, S, C] the encoder's output
  Tensor memory_lengths;  // [B] the source lengths (undefined: all valid)
  std::vector<BlockState> blocks;  // the decoder's
};

class EncoderDecoder : public LanguageModel {
 public:
  // Throws std::invalid_argument for a configuration that does not fit, naming what.
  EncoderDecoder(const ModelConfig& cfg, Generator& gen);

  const ModelConfig& config() const { return cfg_; }
  // Reads inputs and lengths (the source), decoder_inputs and decoder_lengths (the target); the loss
  // scores decoder_targets. Refuses a batch without decoder_inputs, and segment_ids.
  Tensor logits(const Batch& batch) override;
  bool can_decode() const override { return true; }
  std::unique_ptr<DecodeState> new_decode_state() const override { return std::make_unique<EncoderDecoderState>(); }
  // Runs the encoder on inputs [B, S] (lengths [B] or undefined) into a fresh `state`: decoding starts.
  void encode(const Tensor& inputs, const Tensor& lengths, DecodeState& state);
  // Decoder tokens [B, t] continuing `state` (after encode) → logits [B, t, V].
  Tensor forward_step(const Tensor& tokens, DecodeState& state) override;
  double mixing_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_context() const override;
  Generator& dropout_generator() override { return dropout_gen_; }

 private:
  Tensor embed(const Tensor& tokens, int64_t start) const;
  Tensor run_encoder(const Tensor& inputs, const Tensor& lengths) const;
  Tensor run_decoder(const Tensor& tokens, const Tensor& memory, const Tensor& memory_lengths, int64_t start,
                     std::vector<BlockState>* states) const;

  ModelConfig cfg_;
  Generator dropout_gen_;
  Embedding& wte_;
  Embedding* wpe_ = nullptr;
  Stack* encoder_ = nullptr;
  Stack* decoder_ = nullptr;
  Linear* lm_head_ = nullptr;
};

double encoder_decoder_parameter_count(const ModelConfig& cfg);
// Per token of a source and a target of seq_len tokens each: the encoder's bidirectional mixing, the
// decoder's causal mixing and its cross attention over seq_len memory tokens.
double encoder_decoder_mixing_flops_per_token(const ModelConfig& cfg, int64_t seq_len);
// The decoder's states after seq_len target tokens, with a source of seq_len tokens: its mixers' and
// each cross attention's keys and values of the memory.
double encoder_decoder_state_size(const ModelConfig& cfg, int64_t seq_len);

}  // namespace seqlab
