#include "layers/model/language_model.h"

#include "autograd/ops.h"

namespace seqlab {

Tensor LanguageModel::loss(const Tensor& tokens, const Tensor& targets) {
  return cross_entropy(forward(tokens), targets, -100);
}

}  // namespace seqlab
