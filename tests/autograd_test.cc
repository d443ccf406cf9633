// The graph and the backward engine: when nodes are recorded, how leaf gradients accumulate, how
// gradients of shared inputs add up, graph release, the needs-mask, multiple roots, errors, and a
// graph deeper than any stack freed without recursion.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using Vec = std::vector<double>;

Tensor leaf(const Vec& v, bool requires_grad = true) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64);
  if (requires_grad) set_requires_grad(t, true);
  return t;
}

bool has_node(const Tensor& t) { return t.autograd_meta() && t.autograd_meta()->grad_fn; }

TEST(Autograd, NoNodeWithoutAnInputThatRequiresGrad) {
  Tensor a = leaf({1, 2, 3}, false), b = leaf({4, 5, 6}, false);
  Tensor y = mul(exp(a), b);
  EXPECT_FALSE(has_node(y));
  EXPECT_FALSE(requires_grad(y));
  EXPECT_THROW(backward(sum(y)), std::invalid_argument);  // nothing to differentiate
}

TEST(Autograd, NoGradGuardRecordsNothingAndRestoresTheMode) {
  Tensor x = leaf({1, 2, 3});
  ASSERT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the inner guard restores the outer's mode, not "on"
    Tensor y = sum(mul(x, x));
    EXPECT_FALSE(has_node(y));
    EXPECT_FALSE(requires_grad(y));
    EXPECT_EQ(y.item(), 14.0);
  }
  EXPECT_TRUE(grad_enabled());
  Tensor y = sum(mul(x, x));
  ASSERT_TRUE(has_node(y));
  EXPECT_EQ(y.autograd_meta()->grad_fn->name, "sum");
}

TEST(Autograd, LeafGradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2, 3});
  backward(sum(mul(x, 3.0)));
  EXPECT_EQ(grad_of(x).to_doubles(), (Vec{3, 3, 3}));
  Tensor first = grad_of(x);
  backward(sum(mul(x, x)));  // d/dx Σ x² = 2x, added on top
  EXPECT_EQ(grad_of(x).to_doubles(), (Vec{5, 7, 9}));
  EXPECT_EQ(first.to_doubles(), (Vec{5, 7, 9}));  // accumulated in place: references stay valid
  clear_grad(x);
  EXPECT_FALSE(grad_of(x).defined());
  backward(sum(x));
  EXPECT_EQ(grad_of(x).to_doubles(), (Vec{1, 1, 1}));
}

TEST(Autograd, ADiamondSumsTheGradientsOfBothPaths) {
  Tensor x = leaf({0.5, -1.0});
  // y = 2x + exp(x): x reaches y along two paths; dy/dx = 2 + exp(x).
  Tensor y = sum(add(mul(x, 2.0), exp(x)));
  backward(y);
  Vec g = grad_of(x).to_doubles();
  EXPECT_DOUBLE_EQ(g[0], 2 + std::exp(0.5));
  EXPECT_DOUBLE_EQ(g[1], 2 + std::exp(-1.0));
  // The same tensor twice in one op: d/dx Σ x ⊙ x = 2x.
  Tensor z = leaf({1.5, -4});
  backward(sum(mul(z, z)));
  EXPECT_EQ(grad_of(z).to_doubles(), (Vec{3, -8}));
  // A deeper diamond: h = tanh(x) feeds both factors of h ⊙ h: d/dx = 2 h (1 − h²).
  Tensor w = leaf({0.3});
  Tensor h = tanh(w);
  backward(sum(mul(h, h)));
  const double t = std::tanh(0.3);
  EXPECT_NEAR(grad_of(w).item(), 2 * t * (1 - t * t), 1e-15);
}

TEST(Autograd, BackwardTwiceNeedsRetainGraph) {
  Tensor x = leaf({1, 2});
  Tensor y = sum(mul(x, x));
  backward(y);
  try {
    backward(y);
    FAIL() << "a second backward through a released graph did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
  Tensor x2 = leaf({1, 2});
  Tensor y2 = sum(mul(x2, x2));
  backward({y2}, {Tensor::scalar(1.0, DType::f64)}, /*retain_graph=*/true);
  backward({y2}, {Tensor::scalar(1.0, DType::f64)}, /*retain_graph=*/true);
  EXPECT_EQ(grad_of(x2).to_doubles(), (Vec{4, 8}));  // 2 · 2x
  backward(y2);  // the last one may release
  EXPECT_EQ(grad_of(x2).to_doubles(), (Vec{6, 12}));
  EXPECT_THROW(backward(y2), std::runtime_error);
}

TEST(Autograd, TheNeedsMaskSkipsInputsThatRequireNoGradient) {
  Tensor a = leaf({1, 2, 3}), b = leaf({4, 5, 6}, false);
  backward(sum(mul(a, b)));
  EXPECT_EQ(grad_of(a).to_doubles(), (Vec{4, 5, 6}));
  EXPECT_FALSE(grad_of(b).defined());
  // What a backward is asked for, seen from inside a node.
  std::vector<bool> asked;
  Tensor c = leaf({1, 1}, false), d = leaf({2, 2});
  Tensor y = kernel::binary(kernel::BinaryOp::add, c, d);
  record("probe", {c, d}, {&y}, {}, [&asked](const auto& g, const auto&, const std::vector<bool>& needs) {
    asked = needs;
    return std::vector<Tensor>{Tensor(), g[0]};
  });
  backward(sum(y));
  EXPECT_EQ(asked, (std::vector<bool>{false, true}));
  EXPECT_EQ(grad_of(d).to_doubles(), (Vec{1, 1}));
  EXPECT_FALSE(grad_of(c).defined());
}

TEST(Autograd, MultipleRootsSeedTheirOwnGradients) {
  Tensor x = leaf({1, 2, 3});
  Tensor y1 = mul(x, x);   // dy1/dx = 2x
  Tensor y2 = sum(x);      // dy2/dx = 1
  backward({y1, y2}, {Tensor::from_vector({1, 10, 100}, {3}, DType::f64), Tensor()});
  EXPECT_EQ(grad_of(x).to_doubles(), (Vec{2 + 1, 40 + 1, 600 + 1}));
  // Two roots sharing a subgraph: the shared node runs once with the sum of both gradients.
  Tensor z = leaf({2});
  Tensor e = exp(z);
  backward({mul(e, 2.0), mul(e, 3.0)}, {Tensor::ones({1}, DType::f64), Tensor::ones({1}, DType::f64)});
  EXPECT_NEAR(grad_of(z).item(), 5 * std::exp(2.0), 1e-12);
}

TEST(Autograd, RootErrorsAreClear) {
  Tensor x = leaf({1, 2});
  Tensor y = mul(x, 2.0);
  try {
    backward(y);
    FAIL() << "backward of a non-scalar root without a gradient did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(backward({y}, {Tensor::ones({3}, DType::f64)}), std::invalid_argument);  // wrong shape
  EXPECT_THROW(backward({y}, {}), std::invalid_argument);                        // one gradient per root
  EXPECT_THROW(set_requires_grad(Tensor::from_indices({1}, {1}), true), std::invalid_argument);
  EXPECT_THROW(set_requires_grad(y, true), std::invalid_argument);  // not a leaf
  // With the gradient given, the non-scalar root is fine.
  backward({y}, {Tensor::from_vector({1, -1}, {2}, DType::f64)});
  EXPECT_EQ(grad_of(x).to_doubles(), (Vec{2, -2}));
}

// A chain of 3·10⁵ ops (a model of 10⁴ small layers records more): freeing it node inside node
// overflowed the 8 MiB stack (a segmentation fault); Node's destructor frees it one node at a time.
TEST(Autograd, AGraphDeeperThanTheStackIsFreed) {
  Tensor x = leaf({0.5});
  Tensor y = x;
  constexpr int kDepth = 300000;
  for (int i = 0; i < kDepth; ++i) y = mul(y, 1.0);
  ASSERT_TRUE(has_node(y));
  y = Tensor();  // frees the whole chain
  EXPECT_TRUE(x.autograd_meta() != nullptr);
  // A shorter chain still differentiates, and its nodes shared with a live tensor stay alive.
  Tensor z = x;
  for (int i = 0; i < 1000; ++i) z = mul(z, 1.0);
  Tensor half = z;
  for (int i = 0; i < 1000; ++i) z = mul(z, 2.0);
  z = Tensor();
  ASSERT_TRUE(has_node(half));
  backward(sum(half));
  EXPECT_EQ(grad_of(x).to_doubles(), Vec{1.0});
}

TEST(Autograd, DetachCutsTheGraph) {
  Tensor x = leaf({3});
  Tensor y = mul(x, x);
  Tensor d = y.detach();
  EXPECT_FALSE(requires_grad(d));
  EXPECT_EQ(d.storage(), y.storage());
  backward(sum(mul(y, d)));  // only the y factor carries gradient: d/dx (x² · 9) = 18x
  EXPECT_EQ(grad_of(x).item(), 54.0);
}

}  // namespace
}  // namespace seqlab
