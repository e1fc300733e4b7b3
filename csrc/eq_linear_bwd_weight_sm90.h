// Hopper (sm_90a) weight-gradient kernel for fp16 / bf16. The launcher of the tensor-core weight
// gradient (eq_linear_bwd_weight_mma.cu) plans the split over rows, provides the workspace and runs
// the reduce kernel; this kernel writes the FP32 partials. Math and layouts: eq_linear_bwd_weight.h.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "eq_linear_bwd_weight_split.cuh"

namespace flash_eqlinear {

struct BwdWeightSm90Args {
  const void* x;       // (M, c, 4), 16-byte aligned
  const void* gy;      // (M, d, 4), 16-byte aligned
  float* ws;           // [S][4][d][ldw] FP32 partials (plane order P0, PR, PI, P2), unscaled
  float* ws_bias;      // [S][bias parts][d] FP32 partial sums of grad_y, or nullptr
  int64_t M;
  int64_t chunk_rows;  // rows per split: a multiple of kBwdWeightSm90Model.BK
  int c, d, ldw, S;
  bool swap;           // x as the A operand (eq_bwd_weight_sm90_swap)
  // The last A tile's split (split::Plan::S_last; 0: S chunks of chunk_rows like the others): 1 .. S chunks of
  // chunk_rows_last rows. Not with swap.
  int S_last = 0;
  int64_t chunk_rows_last = 0;
  // grad_y in gy_parts (1 .. 3) column blocks of d / gy_parts channels: gy and gy_part[0 .. gy_parts - 2],
  // each (M, d / gy_parts, 4), 16-byte aligned; d / gy_parts a multiple of eq_bwd_weight_sm90_gy_part_unit.
  int gy_parts = 1;
  const void* gy_part[2] = {nullptr, nullptr};
};

// The channels a part of grad_y must be a multiple of (one TMA box of the grad_y operand: 16 as the A
// operand, 64 as the B operand with swapped roles).
constexpr int64_t eq_bwd_weight_sm90_gy_part_unit(bool swap) { return swap ? 64 : 16; }

// The tile as the split plan models it: 128 output x 64 input channels, 32 rows per k tile, one block
// of 384 threads per SM. The MAC rate is a planning figure (half the dense fp16 peak of an H100 SM).
constexpr split::TileModel kBwdWeightSm90Model{128, 64, 32, 1, 384, 1024.0, 6000.0, true};

// Bias partials per row chunk: each block of the chunk that shares its grad_y rows (its x tiles: 64
// channels wide, 128 with swapped roles) sums grad_y over a share of its k tiles.
inline int64_t eq_bwd_weight_sm90_bias_parts(int64_t c, bool swap) {
  const int64_t tile = swap ? kBwdWeightSm90Model.BD : kBwdWeightSm90Model.BC;
  return (c + tile - 1) / tile;
}

// Whether the kernel takes x as the A operand (tiles of 128 input channels) and grad_y as the B operand
// (tiles of 64 output channels): where that pads the (d, c) output to fewer tile cells, e.g. d = 192,
// c = 768 (the last 128-wide o tile half empty otherwise). FLASH_EQLINEAR_DEBUG wgrad_swap=0|1 forces either
// (read at each call).
bool eq_bwd_weight_sm90_swap(int64_t c, int64_t d);

// Whether the Hopper kernel runs for these sizes on device dev: an sm_90 device running sm_90a code,
// FLASH_EQLINEAR_SM90 not "0", c and d even (TMA row strides), M < 2^31 - 64 (32-bit TMA row
// coordinates), and a driver with the TMA descriptor encoder. Pointer-independent, so the workspace
// query and the launch agree.
bool eq_bwd_weight_sm90_eligible(int64_t M, int64_t c, int64_t d, int dev);

// One launch of (A tiles) x (B tiles) x args.S blocks on `stream` (the caller checked eligibility).
cudaError_t eq_bwd_weight_sm90_fp16(const BwdWeightSm90Args& args, cudaStream_t stream);
cudaError_t eq_bwd_weight_sm90_bf16(const BwdWeightSm90Args& args, cudaStream_t stream);

}  // namespace flash_eqlinear
