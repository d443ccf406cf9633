// safetensors: round trips of every dtype (0-d and empty tensors too) with metadata, byte-exact
// agreement with the format as another implementation writes it (files built here byte by byte),
// and one test per way a file can be wrong, each a clear error naming the file; the checksums read in
// pieces equal CRC32C of each tensor's bytes, and a damaged header is refused as the reader refuses it.
#include "train/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "tensor/kernels.h"
#include "test_util.h"
#include "train/checkpoint/crc32c.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>(v >> (8 * k));
  return s;
}

// A file as the format specifies it: header length, header (padded with spaces to 8 bytes), data.
std::string st_file(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

const std::string kF32_1_5("\x00\x00\xc0\x3f", 4);    // 1.5f
const std::string kF32_m2("\x00\x00\x00\xc0", 4);     // -2.0f
const std::string kI64_300("\x2c\x01\0\0\0\0\0\0", 8);  // 300
const std::string kBf16_1("\x80\x3f", 2);             // 1.0 in bfloat16

class Safetensors : public testing::ScratchDirTest {
 protected:
  // The error of reading `bytes`; it must be an InvalidArgument naming the file.
  std::string read_error(const std::string& bytes) {
    std::string p = put("bad.safetensors", bytes);
    absl::StatusOr<SafetensorsContents> r = read_safetensors(p);
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    std::string message(r.status().message());
    EXPECT_TRUE(contains(message, p)) << message;
    return message;
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ca = kernel::contiguous(a), cb = kernel::contiguous(b);
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

TEST_F(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", Tensor::from_vector({0.5, -0.0, 1e-40, 3.4e38, -1.0 / 3.0, 7.0}, {2, 3}, DType::f32)},
      {"f64.scalar", Tensor::scalar(1.0 / 3.0, DType::f64)},
      {"bf16", Tensor::from_vector({1.0, -2.5, 3.140625}, {3}, DType::bf16)},
      {"i32.empty", Tensor::zeros({0}, DType::i32)},
      {"i64.empty", Tensor::zeros({2, 0, 3}, DType::i64)},
      {"i64", Tensor::from_indices({INT64_MIN, -1, INT64_MAX, 300}, {2, 2}, DType::i64)},
      {"i32", Tensor::from_indices({INT32_MIN, 5}, {2}, DType::i32)},
      {"strided", kernel::transpose(Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3}, DType::f64), 0, 1)},
  };
  std::map<std::string, std::string> metadata = {{"note", "quote \" backslash \\ newline \n tab \t \x01 caf\xc3\xa9"},
                                                 {"step", "42"}, {"", ""}};
  ASSERT_TRUE(write_safetensors(path("t.safetensors"), tensors, metadata).ok());
  absl::StatusOr<SafetensorsContents> back = read_safetensors(path("t.safetensors"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata, metadata);
  ASSERT_EQ(back->tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back->tensors.count(name)) << name;
    const Tensor& r = back->tensors.at(name);
    EXPECT_TRUE(r.is_contiguous());
    EXPECT_TRUE(same_bits(r, t)) << name << ": " << r << " vs " << t;
  }
  EXPECT_EQ(back->tensors.at("f64.scalar").shape(), Shape{});
  EXPECT_EQ(back->tensors.at("i64.empty").shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(back->tensors.at("strided").to_doubles(), (std::vector<double>{0, 3, 1, 4, 2, 5}));

  // The data starts 8-byte aligned.
  std::string bytes = slurp("t.safetensors");
  uint64_t header_len = 0;
  for (int k = 7; k >= 0; --k) header_len = header_len << 8 | static_cast<unsigned char>(bytes[k]);
  EXPECT_EQ((8 + header_len) % 8, 0u);
}

TEST_F(Safetensors, RoundTripsAnEmptyFile) {
  ASSERT_TRUE(write_safetensors(path("e.safetensors"), {}).ok());
  EXPECT_EQ(slurp("e.safetensors"), st_file("{}", ""));
  absl::StatusOr<SafetensorsContents> back = read_safetensors(path("e.safetensors"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->tensors.empty());
  EXPECT_TRUE(back->metadata.empty());
}

// What the reference implementation writes for {"a.weight": float32 [1.5, -2], "b": int64 300}
// with metadata {"format": "pt"}: compact JSON, sorted names, padding spaces, contiguous data.
std::string reference_file() {
  return st_file(R"({"__metadata__":{"format":"pt"},"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})",
                 kF32_1_5 + kF32_m2 + kI64_300);
}

TEST_F(Safetensors, WritesTheFormatByteForByte) {
  // Given in another order: the file is the same, because tensors are sorted by name.
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"b", Tensor::from_indices({300}, {}, DType::i64)},
      {"a.weight", Tensor::from_vector({1.5, -2.0}, {2}, DType::f32)}};
  ASSERT_TRUE(write_safetensors(path("w.safetensors"), tensors, {{"format", "pt"}}).ok());
  EXPECT_EQ(slurp("w.safetensors"), reference_file());
  std::swap(tensors[0], tensors[1]);
  ASSERT_TRUE(write_safetensors(path("w.safetensors"), tensors, {{"format", "pt"}}).ok());
  EXPECT_EQ(slurp("w.safetensors"), reference_file());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // no temporary left
}

TEST_F(Safetensors, ReadsAHandBuiltFile) {
  absl::StatusOr<SafetensorsContents> r = read_safetensors(put("ref.safetensors", reference_file()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors.at("a.weight").dtype(), DType::f32);
  EXPECT_EQ(r->tensors.at("a.weight").to_doubles(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(r->tensors.at("b").shape(), Shape{});
  EXPECT_EQ(r->tensors.at("b").to_indices(), std::vector<int64_t>{300});

  // Free whitespace, header order unlike data order, escaped names, no metadata, unpadded header.
  std::string header = "{\n  \"caf\\u00e9\\\"x\" : {\"shape\": [1, 2], \"dtype\": \"BF16\",\n"
                       "      \"data_offsets\": [8, 12]},\n"
                       "  \"\\ud83d\\ude00\\/\\t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},\n"
                       "  \"e\": {\"dtype\": \"I32\", \"shape\": [0, 4], \"data_offsets\": [12, 12]}\n}";
  r = read_safetensors(put("ws.safetensors", st_file(header, kF32_m2 + kF32_1_5 + kBf16_1 + kBf16_1, false)));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tensors.size(), 3u);
  EXPECT_TRUE(r->metadata.empty());
  const Tensor& b = r->tensors.at("caf\xc3\xa9\"x");
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.shape(), (Shape{1, 2}));
  EXPECT_EQ(b.to_doubles(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(r->tensors.at("\xf0\x9f\x98\x80/\t").to_doubles(), (std::vector<double>{-2.0, 1.5}));
  EXPECT_EQ(r->tensors.at("e").shape(), (Shape{0, 4}));
}

TEST_F(Safetensors, MissingFile) {
  absl::StatusOr<SafetensorsContents> r = read_safetensors(path("absent.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(contains(std::string(r.status().message()), path("absent.safetensors") + ": cannot open"));
}

TEST_F(Safetensors, TruncatedFile) {
  EXPECT_TRUE(contains(read_error(""), "truncated file: 0 bytes"));
  EXPECT_TRUE(contains(read_error(std::string("\x10\0\0", 3)), "truncated file: 3 bytes"));
  // A whole file cut short: the last tensor's bytes are gone.
  std::string full = reference_file();
  std::string e = read_error(full.substr(0, full.size() - 4));
  EXPECT_TRUE(contains(e, "tensor \"b\": data_offsets [8, 16] lie outside the data section of 12 bytes")) << e;
  EXPECT_TRUE(contains(e, "(truncated file?)")) << e;
  // Cut inside the header.
  e = read_error(full.substr(0, 20));
  EXPECT_TRUE(contains(e, "exceeds the 12 bytes that follow it (truncated file or corrupt header)")) << e;
}

TEST_F(Safetensors, HeaderLengthLargerThanTheFile) {
  std::string e = read_error(le64(1000) + "{}");
  EXPECT_TRUE(contains(e, "header length 1000 exceeds the 2 bytes that follow it")) << e;
  e = read_error(le64(uint64_t{1} << 63) + "{}");  // must not try to allocate it
  EXPECT_TRUE(contains(e, "header length 9223372036854775808 exceeds")) << e;
}

TEST_F(Safetensors, BadJson) {
  struct Case {
    std::string header, message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "corrupt header: unexpected end of the header at byte 0"},
           {"{\"a\": {\"dtype\": \"F32\",}}", "corrupt header: expected a quoted key at byte 22"},
           {"{\"a\" 1}", "expected ':' after key \"a\""},
           {"{\"a\": [1, 2}", "expected ',' or ']' in an array"},
           {"{} x", "unexpected text after the JSON value"},
           {"{\"a\\q\": 1}", "unknown escape '\\q'"},
           {"{\"a\": \"\\ud800\"}", "unpaired high surrogate"},
           {"{\"a", "unterminated string"},
           {"{\"a\": 1.5}", "only integers are expected"},
           {"{\"a\": 01}", "leading zero"},
           {"{\"a\": 99999999999999999999}", "integer too large"},
           {"{\"a\": {}, \"a\": {}}", "duplicate key \"a\""},
           {"[1, 2]", "corrupt header: not a JSON object"},
           {std::string(100, '[') + std::string(100, ']'), "nested too deeply"},
           {"{\"__metadata__\": {\"k\": 1}}", "\"__metadata__\" value of \"k\" is not a string"},
       }) {
    SCOPED_TRACE(c.header);
    std::string e = read_error(st_file(c.header, "", false));
    EXPECT_TRUE(contains(e, c.message)) << e;
  }
}

TEST_F(Safetensors, BadEntries) {
  auto entry = [](const std::string& fields) { return "{\"w\": {" + fields + "}}"; };
  struct Case {
    std::string header, message;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"w\": [1]}", "tensor \"w\": entry is not a JSON object"},
           {entry("\"dtype\": \"F32\", \"shape\": [2]"), "lacks one of \"dtype\", \"shape\", \"data_offsets\""},
           {entry("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8], \"x\": 1"), "unexpected key \"x\""},
           {entry("\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]"),
            "\"shape\" is not an array of non-negative integers"},
           {entry("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]"),
            "\"data_offsets\" is not an array of two non-negative integers"},
           {entry("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]"), "end before they begin"},
       }) {
    SCOPED_TRACE(c.header);
    std::string e = read_error(st_file(c.header, std::string(8, '\0')));
    EXPECT_TRUE(contains(e, c.message)) << e;
  }
}

TEST_F(Safetensors, UnknownDtype) {
  for (std::string dtype : {"F16", "U8", "Q4"}) {
    std::string e = read_error(st_file(R"({"w":{"dtype":")" + dtype + R"(","shape":[4],"data_offsets":[0,8]}})",
                                       std::string(8, '\0')));
    EXPECT_TRUE(contains(e, "tensor \"w\": unsupported dtype \"" + dtype + "\" (supported: F32, F64, BF16, I32, I64)"))
        << e;
  }
}

TEST_F(Safetensors, OffsetsOutOfRange) {
  std::string e = read_error(st_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "tensor \"w\": data_offsets [0, 16] lie outside the data section of 8 bytes")) << e;
  e = read_error(st_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[9,9]}})", kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "data_offsets [9, 9] lie outside the data section of 8 bytes")) << e;
}

TEST_F(Safetensors, OverlappingOffsets) {
  std::string e = read_error(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     kF32_1_5 + kF32_m2 + kF32_1_5));
  EXPECT_TRUE(contains(e, "tensors \"a\" [0, 8] and \"b\" [4, 12] overlap")) << e;
  // Two tensors on the same bytes.
  e = read_error(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                         kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "overlap")) << e;
}

TEST_F(Safetensors, GapsAndTrailingBytes) {
  std::string e = read_error(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                     kF32_1_5 + kF32_m2 + kF32_1_5));
  EXPECT_TRUE(contains(e, "bytes [4, 8) of the data section belong to no tensor")) << e;
  e = read_error(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "bytes [4, 8) of the data section belong to no tensor")) << e;
}

TEST_F(Safetensors, ShapeSizeMismatch) {
  std::string e = read_error(st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "tensor \"w\": shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8")) << e;
  // A shape whose size overflows 64 bits is reported, not allocated.
  e = read_error(st_file(R"({"w":{"dtype":"F64","shape":[4611686018427387904,8],"data_offsets":[0,8]}})",
                         kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "is too large")) << e;
  e = read_error(st_file(R"({"w":{"dtype":"F64","shape":[536870912,536870912],"data_offsets":[0,8]}})",
                         kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "needs 2305843009213693952 bytes but data_offsets [0, 8] hold 8")) << e;
  e = read_error(st_file(R"({"w":{"dtype":"F64","shape":[2147483648,2147483648],"data_offsets":[0,8]}})",
                         kF32_1_5 + kF32_m2));
  EXPECT_TRUE(contains(e, "needs too many bytes")) << e;
}

TEST_F(Safetensors, WriterRejectsBadNames) {
  Tensor t = Tensor::zeros({1});
  absl::Status s = write_safetensors(path("d.safetensors"), {{"a", t}, {"b", t}, {"a", t}});
  EXPECT_TRUE(contains(std::string(s.message()), "tensor name \"a\" appears twice")) << s;
  s = write_safetensors(path("d.safetensors"), {{"__metadata__", t}});
  EXPECT_TRUE(contains(std::string(s.message()), "cannot write a tensor named \"__metadata__\"")) << s;
  s = write_safetensors(path("d.safetensors"), {{"u", Tensor()}});
  EXPECT_TRUE(contains(std::string(s.message()), "tensor \"u\" is undefined")) << s;
  EXPECT_FALSE(fs::exists(path("d.safetensors")));
  std::string p = path("no/such/dir/t.safetensors");
  s = write_safetensors(p, {{"a", t}});
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(contains(std::string(s.message()), p)) << s;
}

TEST_F(Safetensors, ChecksumsOfEveryTensorReadInPieces) {
  // A tensor of 3 MiB and a bit (read in four pieces of at most 1 MiB), a small one and an empty one.
  Generator gen(3);
  Tensor big = Tensor::randn({786433}, gen), small = Tensor::from_vector({1.5, -2.0}, {2}), empty = Tensor::zeros({0, 4});
  const std::string p = path("c.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"big", big}, {"small", small}, {"empty", empty}}, {{"k", "v"}}).ok());
  absl::StatusOr<SafetensorsChecksums> c = read_safetensors_checksums(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  ASSERT_EQ(c->crc32c.size(), 3u);
  EXPECT_EQ(c->crc32c.at("big"), crc32c(big.raw_data(), big.nbytes()));
  EXPECT_EQ(c->crc32c.at("small"), crc32c(small.raw_data(), small.nbytes()));
  EXPECT_EQ(c->crc32c.at("empty"), 0u);
  // The same header checks as read_safetensors: a file cut short is refused, naming it.
  const std::string bytes = slurp("c.safetensors");
  const std::string cut = put("cut.safetensors", bytes.substr(0, bytes.size() - 4));
  absl::StatusOr<SafetensorsChecksums> bad = read_safetensors_checksums(cut);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(std::string(bad.status().message()), cut + ": corrupt header: tensor \"small\"")) << bad.status();
  EXPECT_EQ(read_safetensors_checksums(path("absent.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace seqlab
