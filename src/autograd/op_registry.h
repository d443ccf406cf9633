// The op registry: every differentiable op — primitive here, fused variant ops in src/layers — is
// described once (inputs, outputs, attributes with defaults, an example at small odd shapes) so
// that one harness can run it from .npy files (`./train op`), gradient-check it, and compare its
// devices, without per-op glue.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class OpInputKind {
  floating,  // f32/f64, differentiable
  index,     // i32/i64, never differentiated
  mask,      // any dtype, read as ≠ 0, never differentiated
};

struct OpInputSpec {
  std::string name;
  OpInputKind kind = OpInputKind::floating;
  bool optional = false;  // may be absent (passed to forward as an undefined tensor)
};

enum class AttrType { integer, number, boolean, string, int_list };

struct OpAttrSpec {
  std::string name;
  AttrType type = AttrType::number;
  std::string default_value;  // as it would be written on the command line: 1e-5, true, -1, 0,2
  std::string help;
};

// Attribute values of one call, validated against the op's specs when parsed.
class OpAttrs {
 public:
  OpAttrs() = default;
  // Defaults, overridden by `given` (name → text). Throws std::invalid_argument naming the op and
  // attribute for an unknown name or a value of the wrong type.
  static OpAttrs parse(const std::string& op, const std::vector<OpAttrSpec>& specs,
                       const std::map<std::string, std::string>& given);
  int64_t get_int(const std::string& name) const;
  double get_number(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  std::vector<int64_t> get_int_list(const std::string& name) const;

 private:
  const std::string& raw(const std::string& name) const;
  std::string op_;
  std::map<std::string, std::string> values_;
};

struct OpSpec {
  std::string name;
  std::string summary;  // one line: the equation
  std::vector<OpInputSpec> inputs;
  std::vector<std::string> outputs;
  std::vector<OpAttrSpec> attrs;
  // Runs the differentiable forward; one tensor per name in `outputs`.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const OpAttrs& attrs)> forward;
  // Inputs at small odd shapes for gradient checks and device comparisons, in `dtype` for
  // floating inputs; floating values keep away from kinks (relu at 0, ties of max) by design.
  std::function<std::vector<Tensor>(Generator& gen, DType dtype)> example;
  // Attribute values the example is meant to be run with (besides the defaults).
  std::map<std::string, std::string> example_attrs;
};

void register_op(OpSpec spec);
const std::vector<OpSpec>& registered_ops();  // sorted by name
const OpSpec* find_op(const std::string& name);

// JSON text of one spec, as `./train op --list` prints it.
std::string op_spec_json(const OpSpec& spec);

}  // namespace seqlab

#define SEQLAB_REGISTER_OP(spec_expr) \
  static const bool SEQLAB_CONCAT(seqlab_op_registered_, __LINE__) = (::seqlab::register_op(spec_expr), true)
