// .npy layout: magic "\x93NUMPY", major and minor version bytes, the header length (uint16 in 1.0,
// uint32 in 2.0, little-endian), the header — a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and ending in '\n' so
// the data starts on a 64-byte boundary — then the raw elements.
#include "tensor/npy.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tensor/kernels.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.cpp copies little-endian file data straight into memory"
#endif

namespace seqlab {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// A recursive-descent reader for the only dict literal .npy headers contain: string keys mapping to
// a quoted string, True/False, or a tuple of non-negative integers. Returns "" or what is wrong.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : s_(text) {}

  std::string parse(Header* h) {
    bool have_descr = false, have_order = false, have_shape = false;
    if (!consume('{')) return "header does not start with '{'";
    while (!consume('}')) {
      std::string key;
      if (!quoted(&key)) return "expected a quoted key in the header";
      if (!consume(':')) return "expected ':' after '" + key + "'";
      if (key == "descr") {
        if (!quoted(&h->descr)) return "'descr' is not a quoted string";
        have_descr = true;
      } else if (key == "fortran_order") {
        if (!boolean(&h->fortran_order)) return "'fortran_order' is not True or False";
        have_order = true;
      } else if (key == "shape") {
        if (!tuple(&h->shape)) return "'shape' is not a tuple of non-negative integers";
        have_shape = true;
      } else {
        return "unexpected key '" + key + "' in the header";
      }
      if (!consume(',')) {
        if (!consume('}')) return "expected ',' or '}' in the header";
        break;
      }
    }
    if (!have_descr || !have_order || !have_shape) return "header lacks one of 'descr', 'fortran_order', 'shape'";
    return "";
  }

 private:
  void skip_space() {
    while (i_ < s_.size() && absl::ascii_isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool consume(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool quoted(std::string* out) {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return false;
    size_t end = s_.find(s_[i_], i_ + 1);
    if (end == absl::string_view::npos) return false;
    *out = std::string(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return true;
  }
  bool word(absl::string_view w) {
    skip_space();
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool boolean(bool* out) {
    if (word("True")) return *out = true, true;
    if (word("False")) return *out = false, true;
    return false;
  }
  bool tuple(Shape* out) {
    out->clear();
    if (!consume('(')) return false;
    while (!consume(')')) {
      skip_space();
      size_t start = i_;
      while (i_ < s_.size() && absl::ascii_isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      int64_t d;
      if (!absl::SimpleAtoi(s_.substr(start, i_ - start), &d)) return false;
      out->push_back(d);
      if (!consume(',')) return consume(')');
    }
    return true;
  }

  absl::string_view s_;
  size_t i_ = 0;
};

const char* descr_of(DType d) {
  switch (d) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::bf16: break;
  }
  return nullptr;
}

bool dtype_of_descr(const std::string& descr, DType* out) {
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    if (descr == descr_of(d)) return *out = d, true;
  }
  return false;
}

std::string shape_tuple(const Shape& s) {
  if (s.size() == 1) return absl::StrCat("(", s[0], ",)");
  return absl::StrCat("(", absl::StrJoin(s, ", "), ")");
}

uint32_t little_endian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

absl::StatusOr<Tensor> read_npy(const std::string& path) {
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(path + ": " + what); };
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));

  unsigned char pre[12];
  size_t got = std::fread(pre, 1, 8, f.get());
  if (got < 8 || std::memcmp(pre, kMagic, kMagicLen) != 0) return fail("not a .npy file (bad magic)");
  int major = pre[6], minor = pre[7];
  if ((major != 1 && major != 2) || minor != 0) {
    return fail(absl::StrCat("unsupported .npy format version ", major, ".", minor, " (1.0 and 2.0 are read)"));
  }
  int len_bytes = major == 1 ? 2 : 4;
  if (std::fread(pre + 8, 1, len_bytes, f.get()) != static_cast<size_t>(len_bytes)) {
    return fail("truncated header");
  }
  uint32_t header_len = little_endian(pre + 8, len_bytes);
  // The header must lie within the file before it is allocated: a corrupt 2.0 length (up to 4 GiB)
  // would otherwise make a file of a few bytes allocate gigabytes.
  const long after_len = std::ftell(f.get());
  if (after_len < 0 || std::fseek(f.get(), 0, SEEK_END) != 0) return fail("cannot seek in the file");
  const long file_size = std::ftell(f.get());
  if (file_size < after_len || std::fseek(f.get(), after_len, SEEK_SET) != 0) return fail("cannot seek in the file");
  if (header_len > static_cast<uint64_t>(file_size - after_len)) {
    return fail(absl::StrCat("truncated header: its length ", header_len, " exceeds the ", file_size - after_len,
                             " bytes that follow it"));
  }
  std::string text(header_len, '\0');
  if (std::fread(text.data(), 1, header_len, f.get()) != header_len) return fail("truncated header");

  Header h;
  std::string error = HeaderParser(text).parse(&h);
  if (!error.empty()) return fail(error + ": " + std::string(absl::StripAsciiWhitespace(text)));
  DType dtype;
  if (!dtype_of_descr(h.descr, &dtype)) {
    return fail("unsupported dtype '" + h.descr + "' (supported: <f4 <f8 <i4 <i8; convert with .astype)");
  }
  if (h.fortran_order) return fail("fortran_order arrays are not supported (save np.ascontiguousarray(a))");
  // The data size is checked against the file before allocating, so a corrupt shape cannot ask for
  // terabytes; the running product stays below 2^62 bytes so it cannot overflow either.
  uint64_t need = dtype_size(dtype);
  // A zero dimension makes the data empty, but the other dimensions still set the strides: their product
  // (each zero counted as 1) must stay below 2^62 bytes too, or a (0, 10^10, 10^10) header would make a
  // tensor whose strides overflow.
  uint64_t span = dtype_size(dtype);
  for (int64_t d : h.shape) {
    if (d != 0 && need > (uint64_t{1} << 62) / static_cast<uint64_t>(d)) need = UINT64_MAX;
    if (need != UINT64_MAX) need *= static_cast<uint64_t>(d);
    const uint64_t extent = static_cast<uint64_t>(std::max<int64_t>(d, 1));
    span = span > (uint64_t{1} << 62) / extent ? UINT64_MAX : span * extent;
  }
  if (span == UINT64_MAX) {
    return fail("shape " + shape_tuple(h.shape) + " is too large: its dimensions multiply past 2^62 bytes");
  }
  long start = std::ftell(f.get());
  if (start < 0 || std::fseek(f.get(), 0, SEEK_END) != 0) return fail("cannot seek in the file");
  uint64_t have = static_cast<uint64_t>(std::ftell(f.get()) - start);
  std::string what = absl::StrCat("shape ", shape_tuple(h.shape), " of ", h.descr, " needs ",
                                  need == UINT64_MAX ? "too many" : absl::StrCat(need), " bytes but ", have,
                                  " follow the header");
  if (have < need) return fail("truncated data: " + what);
  if (have > need) return fail("size mismatch: " + what);

  Tensor t = Tensor::empty(h.shape, dtype);
  if (std::fseek(f.get(), start, SEEK_SET) != 0 || (need && std::fread(t.raw_data(), 1, need, f.get()) != need)) {
    return fail("read failed");
  }
  return t;
}

absl::Status write_npy(const std::string& path, const Tensor& t) {
  if (!t.defined()) return absl::InvalidArgumentError(path + ": cannot write an undefined tensor");
  Tensor host = kernel::contiguous(kernel::to_device(t, cpu_device()));
  if (host.dtype() == DType::bf16) host = kernel::to_dtype(host, DType::f32);

  std::string header = absl::StrCat("{'descr': '", descr_of(host.dtype()),
                                    "', 'fortran_order': False, 'shape': ", shape_tuple(host.shape()), ", }");
  // Spaces and a final '\n' pad the header so the data starts on a 64-byte boundary. Version 1.0
  // stores the header length in 16 bits; only a header longer than that needs 2.0.
  auto padding = [&](size_t preamble) { return (kAlign - (preamble + header.size() + 1) % kAlign) % kAlign; };
  int major = header.size() + 1 + padding(10) <= 65535 ? 1 : 2;
  size_t preamble = major == 1 ? 10 : 12;
  header.append(padding(preamble), ' ');
  header += '\n';
  unsigned char pre[12];
  std::memcpy(pre, kMagic, kMagicLen);
  pre[6] = static_cast<unsigned char>(major);
  pre[7] = 0;
  for (size_t i = 0; i < preamble - 8; ++i) pre[8 + i] = static_cast<unsigned char>(header.size() >> (8 * i));

  // Same folder as the target, so the rename cannot cross file systems.
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  auto fail = [&](const char* what) {
    std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": ", what, " (", reason, ")"));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return absl::InternalError(absl::StrCat(path, ": cannot create ", tmp, " (", std::strerror(errno), ")"));
  bool ok = std::fwrite(pre, 1, preamble, f) == preamble &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (host.nbytes() == 0 || std::fwrite(host.raw_data(), 1, host.nbytes(), f) == host.nbytes()) &&
            std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) return fail("write failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename failed");
  return absl::OkStatus();
}

}  // namespace seqlab
