// NumPy .npy files: the interchange format of `seqlab op` and of tests against NumPy.
//
// Read: format versions 1.0 and 2.0, little-endian <f4 <f8 <i4 <i8, C order, any rank (0-d too).
// Write: version 1.0 (2.0 only when the header outgrows 64 KiB), the tensor's values in row-major
// order whatever its strides; bf16 is written as <f4 because NumPy has no bfloat16. A write goes to
// a temporary name in the same folder, is flushed, then renamed, so a reader never sees half a file.
#pragma once

#include <string>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "tensor/tensor.h"

namespace seqlab {

// A contiguous CPU tensor holding the file's array. Errors name the file and what is wrong.
absl::StatusOr<Tensor> read_npy(const std::string& path);

absl::Status write_npy(const std::string& path, const Tensor& t);

}  // namespace seqlab
