// Small file and randomness helpers shared by the data layer (tokenizers, shards, loaders, synthetic
// tasks): whole-file reads, atomic writes, read-only memory maps, and random draws whose results do not
// depend on the standard library (std::uniform_int_distribution and std::shuffle differ between
// libstdc++ and libc++, which would break "one seed determines everything" across machines).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include "tensor/tensor.h"

namespace seqlab {

// The whole file as bytes. Errors name the file and the system's reason.
absl::StatusOr<std::string> read_file(const std::string& path);

// Writes `parts` one after another to a temporary name in the same folder, flushes, fsyncs and renames
// it over `path`, so a reader never sees half a file and a failure leaves the old file in place.
absl::Status write_file_atomic(const std::string& path, std::initializer_list<absl::string_view> parts);

// Removes the entries of `folder` (files or folders) named "<name>.tmp.<pid>" whose process <pid> is no
// longer running: what a writer killed midway leaves (write_file_atomic's temporary file, prepare's
// temporary folder). Those of running processes, the caller's own included, stay; so does everything
// else. A pid is judged on this machine: writers on other machines sharing the folder are not seen.
// Returns the names removed.
std::vector<std::string> remove_dead_temporaries(const std::string& folder);

// A read-only, private memory map of a whole file; unmapped when the last move of it goes away.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const unsigned char* data() const { return static_cast<const unsigned char*>(data_); }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// splitmix64's finaliser: a bijective scrambling of 64 bits, used to derive independent seeds from
// (seed, epoch) or (seed, step) without the streams overlapping in practice.
uint64_t mix64(uint64_t x);
inline uint64_t mix_seed(uint64_t seed, uint64_t salt) { return mix64(mix64(seed) ^ mix64(salt + 0x9e3779b97f4a7c15ull)); }

// 64-bit FNV-1a, for cache keys (not for security).
uint64_t fnv1a64(absl::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);

// Uniform in [0, n) for n > 0, by rejection, so there is no modulo bias; same value on every platform.
uint64_t random_below(Generator& gen, uint64_t n);
// Fisher-Yates with random_below: the same permutation for the same generator state everywhere.
template <class T>
void shuffle_in_place(std::vector<T>& v, Generator& gen) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[random_below(gen, i)]);
}

}  // namespace seqlab
