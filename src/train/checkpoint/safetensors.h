// safetensors files: the checkpoint format (model weights under stable dotted names, optimizer and
// loader state beside them), readable by any other safetensors implementation.
//
// Layout: an 8-byte little-endian unsigned header length N; N bytes of JSON
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// then the data section: each tensor's elements, row-major and little-endian, at
// [begin, end) relative to the start of the data section. dtypes: F32 F64 BF16 I32 I64.
//
// Written: tensors sorted by name, laid out contiguously in that order, the header padded with
// spaces so the data starts on an 8-byte boundary, "__metadata__" first and only when non-empty;
// to a temporary name in the same folder, flushed, fsynced and renamed.
// Read: every structural rule is checked before anything is allocated (header length within the
// file, JSON syntax, known dtypes, shape × element size = byte length, offsets inside the data
// section, covering it without gaps or overlaps); a violation is an InvalidArgument naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "tensor/tensor.h"

namespace seqlab {

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;         // contiguous CPU tensors
  std::map<std::string, std::string> metadata;
};

// Tensors may live on any device and have any strides. Names must be non-empty, unique and not
// "__metadata__".
absl::Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

absl::StatusOr<SafetensorsContents> read_safetensors(const std::string& path);

// The metadata of a file and the CRC32C (crc32c.h) of every tensor's bytes as the file stores them,
// by name: the header checked as read_safetensors checks it, the data read in pieces of 1 MiB, so no
// tensor is held in memory (checking a checkpoint on disk costs no more memory than that).
struct SafetensorsChecksums {
  std::map<std::string, std::string> metadata;
  std::map<std::string, uint32_t> crc32c;
};
absl::StatusOr<SafetensorsChecksums> read_safetensors_checksums(const std::string& path);

}  // namespace seqlab
