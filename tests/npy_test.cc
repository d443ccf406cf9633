// .npy reading and writing: round trips of every dtype and awkward shapes, byte-exact agreement with
// what NumPy writes (files built here byte by byte), and one test per way a file can be wrong.
#include "tensor/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

class Npy : public testing::ScratchDirTest {
 protected:
  // The error message of reading `bytes` as a .npy file; it must name the file.
  std::string read_error(const std::string& bytes) const {
    std::string p = put("bad.npy", bytes);
    absl::StatusOr<Tensor> t = read_npy(p);
    EXPECT_FALSE(t.ok());
    std::string msg(t.status().message());
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    return msg;
  }
};

// A version 1.0 file as NumPy lays it out: header padded with spaces to a 64-byte boundary.
std::string npy_v1(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
  std::string len{static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  return std::string("\x93NUMPY\x01\x00", 8) + len + header + data;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(Npy, RoundTripsEveryDtypeAndShape) {
  const Shape shapes[] = {{}, {1}, {7}, {3, 1, 5}, {2, 0, 3}, {1, 1, 1, 2}};
  for (DType dtype : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_str(shape));
      std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
      for (size_t i = 0; i < values.size(); ++i) values[i] = (i % 2 ? -1.0 : 1.0) * (static_cast<double>(i) + 0.5 * is_floating(dtype));
      Tensor t = Tensor::from_vector(values, shape, dtype);
      ASSERT_TRUE(write_npy(path("t.npy"), t).ok());
      absl::StatusOr<Tensor> back = read_npy(path("t.npy"));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->dtype(), dtype);
      EXPECT_EQ(back->shape(), shape);
      EXPECT_TRUE(back->is_contiguous());
      EXPECT_EQ(back->to_doubles(), values);
    }
  }
}

TEST_F(Npy, KeepsExtremeValuesExactly) {
  std::vector<int64_t> big = {INT64_MIN, -1, INT64_MAX, int64_t{1} << 53 | 1};
  ASSERT_TRUE(write_npy(path("i.npy"), Tensor::from_indices(big, {4})).ok());
  EXPECT_EQ(read_npy(path("i.npy"))->to_indices(), big);
  std::vector<double> f = {1e-310, -0.0, 1.0 / 3.0, 1e300};
  ASSERT_TRUE(write_npy(path("f.npy"), Tensor::from_vector(f, {2, 2}, DType::f64)).ok());
  EXPECT_EQ(read_npy(path("f.npy"))->to_doubles(), f);
}

TEST_F(Npy, WritesBf16AsF32) {
  Tensor t = Tensor::from_vector({1.0, -2.5, 3.140625}, {3}, DType::bf16);
  ASSERT_TRUE(write_npy(path("b.npy"), t).ok());
  absl::StatusOr<Tensor> back = read_npy(path("b.npy"));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dtype(), DType::f32);
  EXPECT_EQ(back->to_doubles(), t.to_doubles());
}

TEST_F(Npy, WritesAStridedViewInRowMajorOrder) {
  Tensor t = kernel::transpose(Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3}, DType::f64), 0, 1);
  ASSERT_FALSE(t.is_contiguous());
  ASSERT_TRUE(write_npy(path("t.npy"), t).ok());
  absl::StatusOr<Tensor> back = read_npy(path("t.npy"));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->shape(), (Shape{3, 2}));
  EXPECT_EQ(back->to_doubles(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

// np.save(f, np.array([[0.5, -2.0, 1.0], [0.0, 4.0, -0.25]])) writes exactly these 176 bytes.
std::string numpy_f8_2x3() {
  std::string data;
  for (const char* v : {"\x00\x00\x00\x00\x00\x00\xe0\x3f", "\x00\x00\x00\x00\x00\x00\x00\xc0",
                        "\x00\x00\x00\x00\x00\x00\xf0\x3f", "\x00\x00\x00\x00\x00\x00\x00\x00",
                        "\x00\x00\x00\x00\x00\x00\x10\x40", "\x00\x00\x00\x00\x00\x00\xd0\xbf"}) {
    data.append(v, 8);
  }
  return npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", data);
}

TEST_F(Npy, ReadsWhatNumpyWrites) {
  std::string bytes = numpy_f8_2x3();
  ASSERT_EQ(bytes.size(), 176u);
  absl::StatusOr<Tensor> t = read_npy(put("np.npy", bytes));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::f64);
  EXPECT_EQ(t->shape(), (Shape{2, 3}));
  EXPECT_EQ(t->to_doubles(), (std::vector<double>{0.5, -2.0, 1.0, 0.0, 4.0, -0.25}));

  // A 0-d int32 array and a 1-d int64 one, as NumPy writes them.
  t = read_npy(put("s.npy", npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (), }",
                                   std::string("\xfe\xff\xff\xff", 4))));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), Shape{});
  EXPECT_EQ(t->to_indices(), std::vector<int64_t>{-2});
  t = read_npy(put("v.npy", npy_v1("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                                   std::string("\x2c\x01\0\0\0\0\0\0\x07\0\0\0\0\0\0\0", 16))));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->to_indices(), (std::vector<int64_t>{300, 7}));
}

TEST_F(Npy, WritesWhatNumpyWrites) {
  Tensor t = Tensor::from_vector({0.5, -2.0, 1.0, 0.0, 4.0, -0.25}, {2, 3}, DType::f64);
  ASSERT_TRUE(write_npy(path("t.npy"), t).ok());
  EXPECT_EQ(slurp("t.npy"), numpy_f8_2x3());
}

TEST_F(Npy, ReadsVersion2) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
  header += std::string(63 - (12 + header.size()) % 64, ' ') + "\n";
  std::string bytes = std::string("\x93NUMPY\x02\x00", 8) + static_cast<char>(header.size()) +
                      std::string(3, '\0') + header + std::string("\x00\x00\xc0\x3f", 4);  // 1.5f
  absl::StatusOr<Tensor> t = read_npy(put("v2.npy", bytes));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::f32);
  EXPECT_EQ(t->to_doubles(), std::vector<double>{1.5});
}

TEST_F(Npy, WritesVersion2OnlyWhenTheHeaderNeedsIt) {
  Shape many(25000, 1);  // "1, " per dimension: a header beyond 64 KiB
  Tensor t = Tensor::full(many, 2.0, DType::f32);
  ASSERT_TRUE(write_npy(path("many.npy"), t).ok());
  EXPECT_EQ(slurp("many.npy").substr(0, 8), std::string("\x93NUMPY\x02\x00", 8));
  absl::StatusOr<Tensor> back = read_npy(path("many.npy"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape(), many);
  EXPECT_EQ(back->to_doubles(), std::vector<double>{2.0});
  ASSERT_TRUE(write_npy(path("few.npy"), Tensor::zeros({3})).ok());
  EXPECT_EQ(slurp("few.npy")[6], '\x01');
}

TEST_F(Npy, WriteLeavesNoTemporaryAndReplacesTheOldFile) {
  ASSERT_TRUE(write_npy(path("t.npy"), Tensor::zeros({4}, DType::i32)).ok());
  ASSERT_TRUE(write_npy(path("t.npy"), Tensor::ones({2}, DType::f64)).ok());
  EXPECT_EQ(read_npy(path("t.npy"))->to_doubles(), (std::vector<double>{1, 1}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(Npy, WriteIntoAMissingFolderFails) {
  std::string p = path("no/such/dir/t.npy");
  absl::Status s = write_npy(p, Tensor::zeros({2}));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(contains(std::string(s.message()), p)) << s;
}

TEST_F(Npy, MissingFile) {
  absl::StatusOr<Tensor> t = read_npy(path("absent.npy"));
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(std::string(t.status().message()), path("absent.npy")));
  EXPECT_TRUE(contains(std::string(t.status().message()), "cannot open"));
}

TEST_F(Npy, BadMagic) {
  EXPECT_TRUE(contains(read_error("PK\x03\x04 this is a zip"), "bad magic"));
  EXPECT_TRUE(contains(read_error(""), "bad magic"));
}

TEST_F(Npy, UnsupportedVersion) {
  std::string bytes = numpy_f8_2x3();
  bytes[6] = '\x03';
  EXPECT_TRUE(contains(read_error(bytes), "version 3.0"));
}

TEST_F(Npy, UnsupportedDtype) {
  for (const char* descr : {">f4", "<c8", "|b1", "<f2", "<u4"}) {
    std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (1,), }";
    std::string msg = read_error(npy_v1(dict, std::string(8, '\0')));
    EXPECT_TRUE(contains(msg, "unsupported dtype")) << msg;
    EXPECT_TRUE(contains(msg, descr)) << msg;
  }
}

TEST_F(Npy, FortranOrder) {
  std::string msg = read_error(npy_v1("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", std::string(48, '\0')));
  EXPECT_TRUE(contains(msg, "fortran_order")) << msg;
}

TEST_F(Npy, TruncatedData) {
  std::string bytes = numpy_f8_2x3();
  std::string msg = read_error(bytes.substr(0, bytes.size() - 3));
  EXPECT_TRUE(contains(msg, "truncated data")) << msg;
  EXPECT_TRUE(contains(msg, "(2, 3)")) << msg;
}

TEST_F(Npy, AHugeShapeIsRejectedBeforeAllocating) {
  auto error_for = [&](const std::string& shape) {
    std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }";
    return read_error(npy_v1(dict, std::string(8, '\0')));
  };
  std::string msg = error_for("(1099511627776,)");  // 8 TiB: the file holds 8 bytes
  EXPECT_TRUE(contains(msg, "truncated data")) << msg;
  // Past 2^62 bytes, and a zero dimension beside others whose strides would overflow (found by fuzzing:
  // an empty tensor of shape (0, 09999999999, 09999999999, 3) overflowed its strides).
  for (const char* shape : {"(4000000000000, 4000000000000, 3)", "(0, 9999999999, 9999999999, 3)"}) {
    msg = error_for(shape);
    EXPECT_TRUE(contains(msg, "is too large: its dimensions multiply past 2^62 bytes")) << msg;
  }
  EXPECT_TRUE(contains(error_for("(0, 1000, 3)"), "size mismatch"));  // an empty array of fine strides: no data
}

TEST_F(Npy, MoreDataThanTheShapeNeeds) {
  std::string msg = read_error(numpy_f8_2x3() + std::string(8, '\0'));
  EXPECT_TRUE(contains(msg, "size mismatch")) << msg;
}

TEST_F(Npy, TruncatedHeader) {
  EXPECT_TRUE(contains(read_error(numpy_f8_2x3().substr(0, 40)), "truncated header"));
  EXPECT_TRUE(contains(read_error(std::string("\x93NUMPY\x01\x00\x10", 9)), "truncated header"));
}

// Found by fuzzing: a 176-byte version 2.0 file whose header length reads 0xFFFFFFFF made the reader
// (and `seqlab op`) allocate 4 GiB for the header before finding the file too short.
TEST_F(Npy, AHeaderLongerThanTheFileIsRejectedBeforeAllocating) {
  std::string bytes = std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12) + std::string(164, ' ');
  ASSERT_EQ(bytes.size(), 176u);
  std::string msg = read_error(bytes);
  EXPECT_TRUE(contains(msg, "truncated header: its length 4294967295 exceeds the 164 bytes that follow it")) << msg;
  // Version 1.0: a 16-bit length, still checked against the file.
  msg = read_error(std::string("\x93NUMPY\x01\x00\x00\x01", 10) + "{}");
  EXPECT_TRUE(contains(msg, "truncated header: its length 256 exceeds the 2 bytes")) << msg;
}

TEST_F(Npy, MalformedHeader) {
  for (const char* dict : {"{'descr': '<f8', 'fortran_order': False, }", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, -3), }",
                           "['descr', '<f8']", "{'descr': '<f8', 'fortran_order': 0, 'shape': (6,), }",
                           "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), 'extra': 1}"}) {
    std::string msg = read_error(npy_v1(dict, std::string(48, '\0')));
    EXPECT_TRUE(contains(msg, "header") || contains(msg, "shape") || contains(msg, "fortran_order")) << msg;
  }
}

}  // namespace
}  // namespace seqlab
