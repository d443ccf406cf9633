// CRC32C against the standard check value, the test vectors of RFC 3720 (iSCSI, appendix B.4), a
// bit-at-a-time reference computed from the polynomial's definition at every length and alignment,
// and its continuation rule.
#include "train/checkpoint/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace seqlab {
namespace {

// The definition: shift each bit of the message (least significant first) through the reflected
// register, xoring the reflected polynomial 0x82F63B78 whenever a 1 is shifted out.
uint32_t crc32c_bitwise(const std::vector<unsigned char>& bytes) {
  uint32_t r = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    r ^= b;
    for (int bit = 0; bit < 8; ++bit) r = (r >> 1) ^ ((r & 1u) ? 0x82F63B78u : 0u);
  }
  return ~r;
}

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
    down[static_cast<size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, EqualsTheBitwiseDefinitionAtEveryLengthAndOffset) {
  std::mt19937 gen(7);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(gen());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= buf.size(); n += 1 + n / 16) {
      std::vector<unsigned char> part(buf.begin() + static_cast<long>(offset), buf.begin() + static_cast<long>(offset + n));
      ASSERT_EQ(crc32c(buf.data() + offset, n), crc32c_bitwise(part)) << "offset " << offset << " length " << n;
    }
  }
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), whole) << "cut at " << cut;
  }
}

TEST(Crc32c, DetectsAFlippedBit) {
  std::vector<unsigned char> data(1024, 0x5A);
  const uint32_t clean = crc32c(data.data(), data.size());
  for (size_t byte : {size_t{0}, size_t{511}, size_t{1023}}) {
    for (int bit = 0; bit < 8; ++bit) {
      data[byte] ^= static_cast<unsigned char>(1 << bit);
      EXPECT_NE(crc32c(data.data(), data.size()), clean);
      data[byte] ^= static_cast<unsigned char>(1 << bit);
    }
  }
}

}  // namespace
}  // namespace seqlab
