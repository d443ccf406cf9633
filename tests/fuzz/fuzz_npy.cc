// .npy reading (tensor/npy.h), as `seqlab op` reads its inputs: the input is the file. A file that
// reads must write back and read again to the same dtype, shape and bytes.
#include <cstring>

#include "fuzz_util.h"
#include "tensor/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const std::string path =
      fuzz::write_scratch("in.npy", absl::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<Tensor> t = read_npy(path);
  if (!t.ok()) return 0;
  const std::string copy = (fuzz::scratch_dir() / "copy.npy").string();
  absl::Status written = write_npy(copy, *t);
  FUZZ_CHECK(written.ok(), written.ToString());
  absl::StatusOr<Tensor> back = read_npy(copy);
  FUZZ_CHECK(back.ok(), back.status().ToString());
  FUZZ_CHECK(back->dtype() == t->dtype() && back->shape() == t->shape(), "the copy's dtype or shape differs");
  FUZZ_CHECK(t->nbytes() == 0 || std::memcmp(back->raw_data(), t->raw_data(), t->nbytes()) == 0,
             "the copy's values differ");
  return 0;
}
