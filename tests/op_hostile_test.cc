// Every registered op against hostile but well-formed calls, in process: each integer attribute set to
// 2^40, −2^40, −1 and 0, and each input in turn given a zero-sized dimension (empty tensors, zero heads,
// zero head dims) — forward and backward. Each call must either succeed or throw std::invalid_argument or
// std::out_of_range (the op runner turns them into one line and exit code 2); nothing may crash, throw
// std::bad_alloc (an allocation sized by an absurd attribute) or anything else. A new op is covered as
// soon as it is registered.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "autograd/op_registry.h"
#include "autograd/variable.h"

namespace seqlab {
namespace {

class OpHostile : public ::testing::TestWithParam<std::string> {};

// Runs the op's forward, then a backward from every differentiable output; "" when it succeeded or was
// refused with std::invalid_argument, else what went wrong.
std::string outcome(const OpSpec& op, std::vector<Tensor> inputs, const std::map<std::string, std::string>& given) {
  try {
    const OpAttrs attrs = OpAttrs::parse(op.name, op.attrs, given);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && op.inputs[i].kind == OpInputKind::floating) set_requires_grad(inputs[i]);
    }
    std::vector<Tensor> outputs = op.forward(inputs, attrs);
    std::vector<Tensor> roots, seeds;
    for (const Tensor& y : outputs) {
      if (y.defined() && requires_grad(y)) {
        roots.push_back(y);
        seeds.push_back(Tensor::ones(y.shape(), y.dtype(), y.device()));
      }
    }
    if (!roots.empty()) backward(roots, seeds);
    return "";
  } catch (const std::invalid_argument&) {
    return "";
  } catch (const std::out_of_range&) {  // a dimension or index out of range: also one line and exit 2
    return "";
  } catch (const std::bad_alloc&) {
    return "std::bad_alloc";
  } catch (const std::exception& e) {
    return std::string("an exception other than invalid_argument: ") + e.what();
  }
}

TEST_P(OpHostile, AbsurdIntegerAttributesAreRefusedOrHarmless) {
  const OpSpec* op = find_op(GetParam());
  ASSERT_NE(op, nullptr);
  for (const OpAttrSpec& a : op->attrs) {
    if (a.type != AttrType::integer) continue;
    for (const char* value : {"1099511627776", "-1099511627776", "-1", "0"}) {
      Generator gen(7);
      std::map<std::string, std::string> given = op->example_attrs;
      given[a.name] = value;
      EXPECT_EQ(outcome(*op, op->example(gen, DType::f64), given), "") << op->name << " --attr " << a.name << "="
                                                                       << value;
    }
  }
}

TEST_P(OpHostile, EmptyDimensionsAreRefusedOrHarmless) {
  const OpSpec* op = find_op(GetParam());
  ASSERT_NE(op, nullptr);
  Generator gen(8);
  const std::vector<Tensor> example = op->example(gen, DType::f64);
  for (size_t i = 0; i < example.size(); ++i) {
    if (!example[i].defined()) continue;
    for (int64_t d = 0; d < example[i].dim(); ++d) {
      Shape shape = example[i].shape();
      shape[static_cast<size_t>(d)] = 0;
      std::vector<Tensor> inputs = example;
      inputs[i] = Tensor::zeros(shape, example[i].dtype());
      EXPECT_EQ(outcome(*op, inputs, op->example_attrs), "")
          << op->name << ": input " << op->inputs[i].name << " of shape " << shape_str(shape);
    }
  }
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpSpec& op : registered_ops()) names.push_back(op.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpHostile, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace seqlab
