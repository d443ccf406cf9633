// CRC32C (Castagnoli), the checksum of every tensor in a checkpoint (checkpoint.h).
//
// The CRC of a message M is the remainder of M(x)·x³² divided by the Castagnoli polynomial
//   P(x) = x³² + x²⁸ + x²⁷ + x²⁶ + x²⁵ + x²³ + x²² + x²⁰ + x¹⁹ + x¹⁸ + x¹⁴ + x¹³ + x¹¹ + x¹⁰ + x⁹ + x⁸ + x⁶ + 1
// (0x1EDC6F41; 0x82F63B78 with the bits reflected, least significant first), with the register
// started at all ones and the result inverted, as iSCSI, ext4 and SSE4.2's crc32 instruction compute
// it: crc32c("123456789") = 0xE3069283. It detects every burst error of up to 32 bits and, at the
// sizes of checkpoint tensors, any other damage with probability 1 − 2⁻³².
#pragma once

#include <cstddef>
#include <cstdint>

namespace seqlab {

// The CRC32C of `n` bytes at `data`, continuing `crc` (the CRC of the bytes before them; 0 to start):
// crc32c(b, m + n) == crc32c(b + m, n, crc32c(b, m)).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace seqlab
