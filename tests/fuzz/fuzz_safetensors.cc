// safetensors reading (train/checkpoint/safetensors.h): the input is the file. A file that reads must
// write back and read again to the same tensors (names, dtypes, shapes, bytes) and metadata.
#include <cstring>

#include "fuzz_util.h"
#include "train/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const std::string path =
      fuzz::write_scratch("in.safetensors", absl::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<SafetensorsContents> read = read_safetensors(path);
  if (!read.ok()) return 0;
  const std::string copy = (fuzz::scratch_dir() / "copy.safetensors").string();
  std::vector<std::pair<std::string, Tensor>> tensors(read->tensors.begin(), read->tensors.end());
  absl::Status written = write_safetensors(copy, tensors, read->metadata);
  FUZZ_CHECK(written.ok(), written.ToString());
  absl::StatusOr<SafetensorsContents> back = read_safetensors(copy);
  FUZZ_CHECK(back.ok(), back.status().ToString());
  FUZZ_CHECK(back->metadata == read->metadata, "the copy's metadata differs");
  FUZZ_CHECK(back->tensors.size() == read->tensors.size(), "the copy holds another number of tensors");
  for (const auto& [name, t] : read->tensors) {
    auto it = back->tensors.find(name);
    FUZZ_CHECK(it != back->tensors.end(), "the copy lacks tensor " + name);
    const Tensor& u = it->second;
    FUZZ_CHECK(u.dtype() == t.dtype() && u.shape() == t.shape(), "tensor " + name + " changed dtype or shape");
    FUZZ_CHECK(t.nbytes() == 0 || std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0,
               "tensor " + name + " changed values");
  }
  return 0;
}
