// One 32 x 32 tile of the adjoint planes: planes (4, d, c) -> adj (4, c, d), each plane transposed and
// plane 2 (PI) negated by its sign bit (exact in every type). Shared by eq_adjoint_planes (a launch of
// its own) and the weight gradient's reduce kernel, whose spare blocks make them for grad_x
// (eq_linear_bwd_weight_split.cuh).
#pragma once

#include <cstdint>

namespace flash_eqlinear {

// U: the element's bits (uint16_t or uint32_t). Tile `tile` of the (ceil(c / 32), ceil(d / 32), 4) grid of
// tiles, x fastest; 256 threads (tid), through shared memory with a padded row (no bank conflicts), so that
// both the reads of planes and the writes of adj are row-contiguous. The caller syncs the block between two
// calls that reuse `buf`.
template <class U>
__device__ __forceinline__ void adjoint_planes_tile(const U* __restrict__ planes, U* __restrict__ adj, int64_t d,
                                                    int64_t c, int64_t tile, U (&buf)[32][33], int tid) {
  constexpr U kSign = U(U(1) << (8 * sizeof(U) - 1));
  const int64_t tiles_c = (c + 31) / 32, tiles_d = (d + 31) / 32;
  const int64_t plane = tile / (tiles_c * tiles_d), rest = tile - plane * tiles_c * tiles_d;
  const int64_t i0 = (rest % tiles_c) * 32, o0 = (rest / tiles_c) * 32;
  const int tx = tid % 32, ty = tid / 32;
  const U flip = plane == 2 ? kSign : U(0);
  const U* src = planes + plane * d * c;
  U* dst = adj + plane * d * c;
  for (int r = ty; r < 32; r += 8) {  // planes row o0 + r, columns i0 + tx
    const int64_t o = o0 + r, i = i0 + tx;
    if (o < d && i < c) buf[r][tx] = U(src[o * c + i] ^ flip);
  }
  __syncthreads();
  for (int r = ty; r < 32; r += 8) {  // adj row i0 + r, columns o0 + tx
    const int64_t i = i0 + r, o = o0 + tx;
    if (i < c && o < d) dst[i * d + o] = buf[tx][r];
  }
}

// Tiles of the whole adjoint: 4 planes of ceil(c / 32) x ceil(d / 32).
inline int64_t adjoint_planes_tiles(int64_t d, int64_t c) { return 4 * ((c + 31) / 32) * ((d + 31) / 32); }

}  // namespace flash_eqlinear
