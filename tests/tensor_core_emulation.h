// The functions of src/cuda/tensor_core.cuh (seqlab::cuda::tc) for kernels run on the CPU by
// tests/cuda_emulation.h, each computing what the PTX ISA documents for the instruction, lane by lane:
//
//   mma_16816: every lane offers its A, B registers; after the warp barrier each lane computes its own four
//       elements of D from the whole 16 × 16 A and 16 × 8 B, reassembled from the documented fragment
//       layouts (src/cuda/tensor_core.cuh), in f32 (products of bf16 values are exact in f32).
//   ldmatrix_x4 (.trans): every lane offers its row address; after the barrier each lane reads its
//       documented elements of the four 8 × 8 matrices from those rows. Row addresses must be 16-byte aligned.
//   cp_async_16 / cp_async_4: read the source when issued, write shared memory only when a
//       cp_async_wait<N>() of the same thread retires the group, so a kernel that reads a tile before
//       waiting for it, or overwrites a buffer other threads still read, computes with the wrong tile
//       and fails its comparison. Alignment is checked (16 or 4 bytes, both sides).
//
// Warp collectives use two alternating sets of slots per warp and one warp barrier each: a lane can
// write set s again only in its collective after next, which it reaches only after every lane has passed
// the barrier of the collective in between, i.e. after every lane has finished reading set s.
// tensor_core_copies_pending() says whether any thread still holds an unretired copy (kernels must wait
// for everything they copy before they return; an empty trailing group is fine).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_emulation.h"

namespace seqlab::cuda::tc {
namespace emulation {

constexpr unsigned kMaxThreads = 1024;

struct WarpSlots {
  std::array<std::array<uint32_t, 6>, 32> words;
  std::array<const void*, 32> address;
};
inline WarpSlots& warp_slots(unsigned warp, unsigned set) {
  static WarpSlots slots[kMaxThreads / 32][2];
  return slots[warp][set];
}
inline unsigned& next_set(unsigned thread) {
  static unsigned sets[kMaxThreads];
  return sets[thread];
}

// This lane's offer of up to 6 words and an address; returns the warp's offers once every lane has made one.
inline const WarpSlots& offer(std::initializer_list<uint32_t> words, const void* address) {
  const unsigned thread = emu::linear_thread(), lane = thread % 32;
  unsigned& set = next_set(thread);
  WarpSlots& s = warp_slots(thread / 32, set);
  set ^= 1u;
  std::copy(words.begin(), words.end(), s.words[lane].begin());
  s.address[lane] = address;
  __syncwarp();
  return s;
}

inline float bf16_half(uint32_t word, int half) {
  seqlab::bf16 x;
  x.bits = static_cast<uint16_t>(word >> (16 * half));
  return static_cast<float>(x);
}
inline uint32_t bits_of(const seqlab::bf16& x) { return x.bits; }

struct Copy {
  dim3 block;  // the issuing block: a copy still pending when its block returned must never land in the next
  void* dst;
  std::array<unsigned char, 16> bytes;
  size_t n;
};
struct ThreadCopies {
  std::vector<Copy> open;                     // issued since the last commit
  std::vector<std::vector<Copy>> committed;  // oldest first
};
inline ThreadCopies& copies(unsigned thread) {
  static ThreadCopies all[kMaxThreads];
  return all[thread];
}
inline void issue(void* dst, const void* src, size_t n) {
  if (reinterpret_cast<uintptr_t>(dst) % n != 0 || reinterpret_cast<uintptr_t>(src) % n != 0) {
    emu::fail("cp.async with a misaligned address");
  }
  Copy c{blockIdx, dst, {}, n};
  std::memcpy(c.bytes.data(), src, n);
  copies(emu::linear_thread()).open.push_back(c);
}

}  // namespace emulation

inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const emulation::WarpSlots& s = emulation::offer({a[0], a[1], a[2], a[3], b0, b1}, nullptr);
  const int lane = static_cast<int>(emu::linear_thread() % 32), g = lane / 4, t = lane % 4;
  // A(row, col) sits in lane 4·(row % 8) + (col % 8) / 2, register (row ≥ 8) + 2·(col ≥ 8), half col % 2;
  // B(k, n) in lane 4n + (k % 8) / 2, register b0 or b1 by k ≥ 8, half k % 2.
  auto A = [&](int row, int col) {
    return emulation::bf16_half(s.words[4 * (row % 8) + (col % 8) / 2][(row >= 8) + 2 * (col >= 8)], col % 2);
  };
  auto B = [&](int k, int n) { return emulation::bf16_half(s.words[4 * n + (k % 8) / 2][4 + (k >= 8)], k % 2); };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    out[e] = sum;
  }
  std::copy(out, out + 4, d);
}

namespace emulation {
inline void ldmatrix(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) emu::fail("ldmatrix with a row address not 16-byte aligned");
  const WarpSlots& s = offer({}, row);
  const int lane = static_cast<int>(emu::linear_thread() % 32), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    auto at = [&](int mrow, int mcol) {
      return bits_of(static_cast<const seqlab::bf16*>(s.address[8 * i + mrow])[mcol]);
    };
    r[i] = trans ? at(2 * t, g) | at(2 * t + 1, g) << 16 : at(g, 2 * t) | at(g, 2 * t + 1) << 16;
  }
}
}  // namespace emulation

inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) { emulation::ldmatrix(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { emulation::ldmatrix(r, row, true); }

inline void cp_async_16(void* dst_shared, const void* src_global) { emulation::issue(dst_shared, src_global, 16); }
inline void cp_async_4(void* dst_shared, const void* src_global) { emulation::issue(dst_shared, src_global, 4); }
inline void cp_async_commit() {
  emulation::ThreadCopies& c = emulation::copies(emu::linear_thread());
  c.committed.push_back(std::move(c.open));
  c.open.clear();
}
template <int N>
void cp_async_wait() {
  emulation::ThreadCopies& c = emulation::copies(emu::linear_thread());
  while (c.committed.size() > static_cast<size_t>(N)) {
    for (const emulation::Copy& copy : c.committed.front()) {
      if (copy.block.x != blockIdx.x || copy.block.y != blockIdx.y || copy.block.z != blockIdx.z) {
        emu::fail("a block returned with cp.async copies it never waited for (they would land in its successor)");
      }
      std::memcpy(copy.dst, copy.bytes.data(), copy.n);
    }
    c.committed.erase(c.committed.begin());
  }
}

inline uint32_t pack_bf16x2(float lo, float hi) {
  return emulation::bits_of(seqlab::bf16(lo)) | emulation::bits_of(seqlab::bf16(hi)) << 16;
}

// Whether any thread holds a copy it never waited for; clears every thread's queue either way.
inline bool tensor_core_copies_pending() {
  bool pending = false;
  for (unsigned t = 0; t < emulation::kMaxThreads; ++t) {
    emulation::ThreadCopies& c = emulation::copies(t);
    pending = pending || !c.open.empty();
    for (const auto& group : c.committed) pending = pending || !group.empty();
    c.open.clear();
    c.committed.clear();
  }
  return pending;
}

}  // namespace seqlab::cuda::tc
