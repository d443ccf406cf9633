// Every registered op, gradient-checked in float64 on its own example inputs (small odd shapes,
// broadcasting where the op broadcasts). A new op is covered as soon as it is registered.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"

namespace seqlab {
namespace {

class OpGradcheck : public ::testing::TestWithParam<std::string> {};

TEST_P(OpGradcheck, MatchesFiniteDifferences) {
  const OpSpec* op = find_op(GetParam());
  ASSERT_NE(op, nullptr);
  ASSERT_TRUE(op->example) << op->name << " has no example inputs";
  Generator gen(42);
  std::vector<Tensor> inputs = op->example(gen, DType::f64);
  OpAttrs attrs = OpAttrs::parse(op->name, op->attrs, op->example_attrs);
  GradcheckResult r = gradcheck([&](const std::vector<Tensor>& x) { return op->forward(x, attrs); }, inputs);
  EXPECT_GT(r.elements_checked, 0);
  EXPECT_LE(r.max_error, 1e-6) << op->name << ": worst at " << r.worst;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpSpec& op : registered_ops()) names.push_back(op.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpGradcheck, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(OpRegistry, ListsAtLeastThirtyPrimitiveOps) { EXPECT_GE(registered_ops().size(), 30u); }

}  // namespace
}  // namespace seqlab
