// One 32 x 32 tile of the adjoint planes: planes (4, d, c) -> adj (4, c, d), each plane transposed and
// plane 2 (PI) negated by its sign bit (exact in every type). Shared by eq_adjoint_planes (a launch of
// its own), the weight gradient's reduce kernel, whose spare blocks make them for grad_x
// (eq_linear_bwd_weight_split.cuh), and the Hopper weight gradient's transform warps.
#pragma once

#include <cstdint>

namespace flash_eqlinear {

// Tiles of the whole adjoint: 4 planes of ceil(c / 32) x ceil(d / 32), x fastest.
inline __host__ __device__ int64_t adjoint_planes_tiles(int64_t d, int64_t c) {
  return 4 * ((c + 31) / 32) * ((d + 31) / 32);
}

// Tile `tile` in two halves through a shared-memory buffer with a padded row (no bank conflicts), so that
// both the reads of planes and the writes of adj are row-contiguous: the load (planes -> buf), then, after
// the caller has synchronised its nthreads threads (a multiple of 32; tid their index), the store (buf ->
// adj). U: the element's bits (uint16_t or uint32_t).
struct AdjointTile {
  int64_t plane, i0, o0;  // plane; first input channel (adj row), first output channel (planes row)
  __device__ __forceinline__ AdjointTile(int64_t d, int64_t c, int64_t tile) {
    const int64_t tiles_c = (c + 31) / 32, per_plane = tiles_c * ((d + 31) / 32);
    plane = tile / per_plane;
    const int64_t rest = tile - plane * per_plane;
    i0 = (rest % tiles_c) * 32;
    o0 = (rest / tiles_c) * 32;
  }

  template <class U>
  __device__ __forceinline__ void load(const U* __restrict__ planes, int64_t d, int64_t c, U (&buf)[32][33],
                                       int tid, int nthreads) const {
    constexpr U kSign = U(U(1) << (8 * sizeof(U) - 1));
    const U flip = plane == 2 ? kSign : U(0);
    const U* src = planes + plane * d * c;
    const int tx = tid % 32;
    for (int r = tid / 32; r < 32; r += nthreads / 32) {  // planes row o0 + r, columns i0 + tx
      const int64_t o = o0 + r, i = i0 + tx;
      if (o < d && i < c) buf[r][tx] = U(src[o * c + i] ^ flip);
    }
  }

  template <class U>
  __device__ __forceinline__ void store(U* __restrict__ adj, int64_t d, int64_t c, const U (&buf)[32][33], int tid,
                                        int nthreads) const {
    U* dst = adj + plane * d * c;
    const int tx = tid % 32;
    for (int r = tid / 32; r < 32; r += nthreads / 32) {  // adj row i0 + r, columns o0 + tx
      const int64_t i = i0 + r, o = o0 + tx;
      if (i < c && o < d) dst[i * d + o] = buf[tx][r];
    }
  }
};

// The whole tile by a block of 256 threads (tid). The caller syncs the block between two calls that reuse
// `buf`.
template <class U>
__device__ __forceinline__ void adjoint_planes_tile(const U* __restrict__ planes, U* __restrict__ adj, int64_t d,
                                                    int64_t c, int64_t tile, U (&buf)[32][33], int tid) {
  const AdjointTile t(d, c, tile);
  t.load(planes, d, c, buf, tid, 256);
  __syncthreads();
  t.store(adj, d, c, buf, tid, 256);
}

}  // namespace flash_eqlinear
