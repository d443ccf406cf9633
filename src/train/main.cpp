#include <iostream>

#include "autograd/op_registry.h"

int main() {
  for (const auto& op : seqlab::registered_ops()) std::cout << seqlab::op_spec_json(op) << "\n";
  return 0;
}
