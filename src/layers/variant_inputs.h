// The input check every fused variant op shares (attention, GLA, retention, linear attention,
// DeltaNet): its q/k/v, states and gates against the layouts of docs/variants/, with one
// wording for every op. An op lists its inputs (name and tensor, in its own order, undefined for an
// absent optional one) and the layout it expects; every failure then throws std::invalid_argument
//
//   "<op>: <why> (got q [2, 5, 3, 4], k [2, 5, 3, 5], ..., initial_state undefined; expected <layout>)"
//
// so a message names the op, what is wrong and every shape it got. The op adds the checks of its own
// options through fail().
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace seqlab {

// The sizes a variant op reads from q [B, T, H, dk], k [B, S, Hk, dk] and v [B, S, Hk, dv] (S = T and
// Hk = H for the recurrences).
struct HeadDims {
  int64_t B, T, H, dk, dv;
  int64_t S, Hk;
};

class VariantInputs {
 public:
  VariantInputs(std::string op, std::vector<std::pair<std::string, Tensor>> inputs, std::string layout);

  // Throws std::invalid_argument: "<op>: <why> (got <every input's shape>; expected <layout>)".
  [[noreturn]] void fail(const std::string& why) const;

  // The named inputs must be given: "q, k, v and beta must all be given".
  void given(std::initializer_list<const char*> names) const;
  // q, k and v given and 4-dimensional; k shaped as q and v agreeing with q in batch, length and heads
  // (the recurrences' layout). Returns the sizes.
  HeadDims qkv() const;
  // Attention's layout: k [B, S, Hk, dk] and v [B, S, Hk, dv] against q [B, T, H, dk], H a multiple of
  // Hk, at least one key.
  HeadDims qkv_with_kv_heads() const;
  // An input, when given, must have `shape`: "<name> must be <layout>" (layout as "[B, T, H]").
  void shaped(const char* name, const Shape& shape, const char* layout) const;
  // Every given input has q's dtype, one of f32, f64 and bf16, and q's device.
  void same_dtype_and_device() const;

  const Tensor& operator[](const char* name) const;

 private:
  std::string op_, layout_;
  std::vector<std::pair<std::string, Tensor>> inputs_;
};

// The names of an op's forms (the op runner's `form` attribute): parse() throws std::invalid_argument
// "<op>: unknown form 'x' (expected chunkwise or recurrent)" for a name it does not have.
template <class Form>
struct FormNames {
  const char* op;
  std::vector<std::pair<const char*, Form>> forms;

  Form parse(const std::string& name) const {
    std::string expected;
    for (size_t i = 0; i < forms.size(); ++i) {
      if (name == forms[i].first) return forms[i].second;
      expected += (i == 0 ? "" : i + 1 == forms.size() ? " or " : ", ") + std::string(forms[i].first);
    }
    throw std::invalid_argument(std::string(op) + ": unknown form '" + name + "' (expected " + expected + ")");
  }
  const char* name(Form form) const {
    for (const auto& [n, f] : forms) {
      if (f == form) return n;
    }
    return "?";
  }
};

// A shape for an error message; "undefined" for an absent tensor.
inline std::string shape_or_undefined(const Tensor& t) {
  return t.defined() ? shape_str(t.shape()) : std::string("undefined");
}

}  // namespace seqlab
