// Hopper (sm_90a) weight-gradient kernel for fp16 / bf16 and its stream-K split. The launcher of the
// tensor-core weight gradient (eq_linear_bwd_weight_mma.cu) plans the split, provides the workspace and
// runs the reduce kernel (eq_linear_bwd_weight_split.cuh); this kernel writes the FP32 partials. Math
// and layouts: eq_linear_bwd_weight.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "eq_linear_bwd_weight_split.cuh"

namespace flash_eqlinear {

// The kernel's tile: 128 output x 64 input channels, k tiles of 32 rows.
constexpr int kBwdWeightSm90BD = 128, kBwdWeightSm90BC = 64, kBwdWeightSm90BK = 32;
// A k tile of a tail tile (below: one consumer warpgroup works) takes about this share of a full tile's
// time (H100: 0.84 at d = 48 against the same tile with both warpgroups, benchmarks/README.md v17).
constexpr double kBwdWeightSm90TailCost = 0.85;
// Each CTA's share is at least this many k tiles where the rows allow (it amortises the pieces'
// prologues and partial stores).
constexpr int64_t kBwdWeightSm90MinShare = 8;

// Stream-K split over the rows. The tiles form two classes: "full" (o tiles 0 .. num_of - 1, each with
// every c tile) and, when d % 128 is in 1 .. 64, "tail" (the last o tile: its consumer warpgroup 2 has
// no channel and idles). The k tiles of a class's tiles, tile after tile (c tile fastest), are its
// units; CTA b of the class's ctas takes units [b U / ctas, (b + 1) U / ctas) (U: the class's units).
// A share can start and end inside a tile: each (CTA, tile) intersection is a piece, whose FP32
// partial goes to workspace slab j, j = its index among the tile's pieces; the reduce sums a tile's
// slabs in order j = 0, 1, ..: deterministic, a pure function of (M, c, d, SM count). The CTAs are
// split between the classes so that both end together (kBwdWeightSm90TailCost), and a CTA holds one
// class only (the warpgroup roles and barrier counts are per CTA).
// Bias: the piece of tile (o tile, c tile) sums grad_y over its k tiles kt with kt % num_c == c tile,
// into bias partial [j][c tile][d]; so each row counts once per o.
// a / b for a >= 0, b > 0, in 32-bit arithmetic where both fit (a 64-bit division is a long
// subroutine on the GPU, and the reduce kernel runs these per output).
__host__ __device__ inline int64_t div_nonneg(int64_t a, int64_t b) {
  return ((a | b) >> 32) == 0 ? int64_t(uint32_t(a) / uint32_t(b)) : a / b;
}

// A piece: tile (o tile, c tile), its k tiles [kt0, kt1), workspace slab j.
struct Sm90Piece {
  int o_tile, c_tile, kt0, kt1, j;
};

struct Sm90StreamPlan {
  int num_c = 0;         // c tiles
  int num_of = 0;        // o tiles of the full class
  int tail = 0;          // 1: the last o tile forms the tail class
  int kt = 0;            // k tiles of every tile: cdiv(M, 32)
  int ctas_full = 0;      // CTAs of the full class: blocks 0 .. ctas_full - 1
  int ctas_tail = 0;      // CTAs of the tail class: the next ctas_tail blocks
  int max_pieces = 0;    // the most pieces of one tile: the workspace's slabs

  // (Named fields, not an array: a kernel parameter indexed at run time is copied to local memory.)
  __host__ __device__ int ctas(int cls) const { return cls ? ctas_tail : ctas_full; }
  __host__ __device__ int64_t units(int cls) const { return int64_t(cls ? tail : num_of) * num_c * kt; }
  // First unit of CTA b of class cls; b = ctas(cls) gives the end of the last share.
  __host__ __device__ int64_t share_begin(int cls, int64_t b) const { return div_nonneg(b * units(cls), ctas(cls)); }
  // The CTA of class cls whose share holds unit u: the largest b with share_begin(b) <= u.
  __host__ __device__ int64_t cta_of(int cls, int64_t u) const {
    return div_nonneg((u + 1) * ctas(cls) - 1, units(cls));
  }
  __host__ __device__ int pieces(int cls, int64_t tile) const {
    return static_cast<int>(cta_of(cls, (tile + 1) * kt - 1) - cta_of(cls, tile * kt) + 1);
  }
  __host__ __device__ int pieces_at(int o_tile, int c_tile) const {
    return o_tile < num_of ? pieces(0, int64_t(o_tile) * num_c + c_tile) : pieces(1, c_tile);
  }
  // The piece of CTA b of class cls (share end: share_begin(cls, b + 1)) that starts at its unit u.
  __host__ __device__ Sm90Piece piece_at(int cls, int64_t b, int64_t end, int64_t u) const {
    const int64_t t = div_nonneg(u, kt);  // the tile, in the class's order
    const int64_t ot = cls ? 0 : div_nonneg(t, num_c);
    Sm90Piece pc;
    pc.kt0 = static_cast<int>(u - t * kt);
    pc.kt1 = static_cast<int>(end - t * kt < kt ? end - t * kt : kt);
    pc.j = static_cast<int>(b - cta_of(cls, t * kt));
    pc.o_tile = cls ? num_of : static_cast<int>(ot);
    pc.c_tile = static_cast<int>(t - ot * num_c);
    return pc;
  }
  // The reduce kernel's Splits interface (eq_linear_bwd_weight_split.cuh): a tile's pieces, and grad_bias
  // from the bias partials [j][c tile][d] of o's tiles, c tile by c tile, piece by piece.
  __host__ __device__ int slabs(int o, int ci) const {
    return pieces_at(o / kBwdWeightSm90BD, ci / kBwdWeightSm90BC);
  }
  __host__ __device__ float bias_sum(const float* wb, int o, int d) const {
    float s = 0.f;
    for (int ct = 0; ct < num_c; ++ct) {
      const int n = pieces_at(o / kBwdWeightSm90BD, ct);
      for (int j = 0; j < n; ++j) s += wb[(int64_t(j) * num_c + ct) * d + o];
    }
    return s;
  }
};

inline Sm90StreamPlan make_sm90_stream_plan(int64_t M, int64_t c, int64_t d, int sms) {
  using split::cdiv;
  Sm90StreamPlan s;
  if (M <= 0 || c <= 0 || d <= 0) return s;  // nothing to split
  s.num_c = static_cast<int>(cdiv(c, kBwdWeightSm90BC));
  s.tail = d % kBwdWeightSm90BD != 0 && d % kBwdWeightSm90BD <= 64 ? 1 : 0;
  s.num_of = static_cast<int>(cdiv(d, kBwdWeightSm90BD)) - s.tail;
  s.kt = static_cast<int>(cdiv(M, kBwdWeightSm90BK));
  const int64_t uf = s.units(0), ut = s.units(1);
  const int64_t ctas = split::imax(1, split::imin(sms < 1 ? 1 : sms, (uf + ut) / kBwdWeightSm90MinShare));
  if (ut == 0 || uf == 0) {
    (ut == 0 ? s.ctas_full : s.ctas_tail) = static_cast<int>(split::imin(ctas, ut == 0 ? uf : ut));
  } else {  // both classes: the split whose slower class ends first
    double best = -1.0;
    for (int64_t pf = 1; pf < split::imax(ctas, 2); ++pf) {
      const int64_t pt = split::imax(ctas - pf, 1);
      if (pf > uf || pt > ut) continue;
      const double t = std::max(double(uf) / double(pf), kBwdWeightSm90TailCost * double(ut) / double(pt));
      if (best < 0 || t < best) {
        best = t;
        s.ctas_full = static_cast<int>(pf);
        s.ctas_tail = static_cast<int>(pt);
      }
    }
  }
  for (int cls = 0; cls < 2; ++cls)
    if (s.ctas(cls) > 0)
      for (int64_t t = 0; t < s.units(cls) / s.kt; ++t) s.max_pieces = std::max(s.max_pieces, s.pieces(cls, t));
  return s;
}

// Workspace (bytes): max_pieces partial slabs [4][d][ldw] then the bias partials [max_pieces][num_c][d].
inline size_t sm90_stream_workspace_bytes(const Sm90StreamPlan& s, int64_t c, int64_t d) {
  return size_t(s.max_pieces) * size_t(4 * d * split::round_up4(c) + int64_t(s.num_c) * d) * sizeof(float);
}

struct BwdWeightSm90Args {
  const void* x;   // (M, c, 4), 16-byte aligned
  const void* gy;  // (M, d, 4), 16-byte aligned
  float* ws;       // [max_pieces][4][d][ldw] FP32 partials (plane order P0, PR, PI, P2), unscaled
  float* ws_bias;  // [max_pieces][num_c][d] FP32 partial sums of grad_y, or nullptr
  int64_t M;
  int c, d, ldw;
  Sm90StreamPlan plan;
};

// Whether the Hopper kernel runs for these sizes on device dev: an sm_90 device running sm_90a code,
// FLASH_EQLINEAR_SM90 not "0", c and d even (TMA row strides), M < 2^31 - 64 (32-bit TMA row
// coordinates), and a driver with the TMA descriptor encoder. Pointer-independent, so the workspace
// query and the launch agree.
bool eq_bwd_weight_sm90_eligible(int64_t M, int64_t c, int64_t d, int dev);

// One launch of plan.ctas_full + plan.ctas_tail CTAs on `stream` (the caller checked eligibility).
cudaError_t eq_bwd_weight_sm90_fp16(const BwdWeightSm90Args& args, cudaStream_t stream);
cudaError_t eq_bwd_weight_sm90_bf16(const BwdWeightSm90Args& args, cudaStream_t stream);

}  // namespace flash_eqlinear
