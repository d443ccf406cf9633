// Runs the CUDA kernels' schedule (src/cuda/scan/gated_scan_schedule.h) on the host: every block of the grid in turn,
// each through HostExec (a phase runs on all of the block's threads before the next phase starts, as the
// barriers order it on the GPU), with the same shared-memory layout, thread-private scratch, reduction
// batches and tile sums as the launchers in src/cuda/scan/gated_scan_kernels.cuh. Shared memory and scratch start as
// NaN, so a read of anything the schedule did not write first shows up in the results. Used by the
// *_cuda_schedule_test.cc programs to check the GPU kernels' logic against the CPU kernels without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cuda/scan/gated_scan_schedule.h"

namespace seqlab::testing {

template <class A>
void emulate_forward(const cuda::scan::Problem<A, A>& pb, A* o, A* final_state) {
  namespace scan = cuda::scan;
  std::vector<A> smem(static_cast<size_t>(scan::forward_shared_elems(pb)));
  for (int64_t b = 0; b < pb.nb; ++b) {
    for (int64_t h = 0; h < pb.nh; ++h) {
      for (int64_t tile = 0; tile < pb.tiles(); ++tile) {
        std::fill(smem.begin(), smem.end(), std::numeric_limits<A>::quiet_NaN());
        scan::HostExec<scan::ForwardThread<A>> ex(pb.threads());
        scan::forward_block(ex, pb, b, h, tile, smem.data(), o, final_state);
      }
    }
  }
}

// io names dout, dfinal and the outputs dv (, dgv, dh0); batch: steps per reduction batch (as the launcher
// picks from the shared memory it may use). Writes dq, dk (and dg when not null) through the tile sums.
template <class A>
void emulate_backward(const cuda::scan::Problem<A, A>& pb, cuda::scan::BackwardIO<A, A> io, int batch, A* dq, A* dk,
                      A* dg) {
  namespace scan = cuda::scan;
  const A nan = std::numeric_limits<A>::quiet_NaN();
  const int64_t N = pb.nb * pb.nt * pb.nh * pb.dk, tiles = pb.tiles(), n = pb.threads();
  const int64_t blocks = pb.nb * pb.nh * tiles;
  io.batch = batch;
  io.want_dg = dg != nullptr;
  std::vector<A> part(static_cast<size_t>((io.want_dg ? 3 : 2) * tiles * N), nan);
  std::vector<A> ckpt(static_cast<size_t>(blocks * pb.segments() * scan::kRows * n), nan);
  std::vector<A> segs(static_cast<size_t>(blocks * scan::kSegment * scan::kRows * n), nan);
  std::vector<A> smem(static_cast<size_t>(scan::backward_shared_elems(pb, batch)));
  io.part = part.data();
  io.ckpt = ckpt.data();
  io.segs = segs.data();
  for (int64_t b = 0; b < pb.nb; ++b) {
    for (int64_t h = 0; h < pb.nh; ++h) {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        std::fill(smem.begin(), smem.end(), nan);
        scan::HostExec<scan::BackwardThread<A>> ex(static_cast<int>(n));
        scan::backward_block(ex, pb, io, b, h, tile, smem.data());
      }
    }
  }
  A* outs[3] = {dq, dk, dg};
  for (int kind = 0; kind < (io.want_dg ? 3 : 2); ++kind) {
    for (int64_t x = 0; x < N; ++x) outs[kind][x] = scan::sum_tiles(part.data(), kind, tiles, N, x);
  }
}

}  // namespace seqlab::testing
