// The split of the weight-gradient reduction over M, shared by the FP32 (SIMT) and the fp16/bf16
// (tensor-core) kernels: how many row chunks S to use, and the fixed-order sum of the S partial tiles.
//
// d x c output tiles alone do not fill the GPU for moderate sizes (c = d = 512: 32 tiles of
// 128 x 64 for 132 SMs), so the rows are cut into S chunks; block z writes its unscaled FP32 partial
// tile to workspace[z][4][d][ldw] (ldw = c rounded up to 4: float4-aligned partial rows) and its
// grad_bias partial to workspace_bias[z][d], and a second kernel sums the partials in the order
// z = 0..S-1, scales and converts: deterministic, no atomics. S is a pure function of (M, c, d, SM
// count, tile models), so results are bitwise reproducible on a given GPU model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "eq_adjoint_tile.cuh"
#include "eq_elem_convert.cuh"  // from_float
#include "eq_pdl.cuh"

namespace flash_eqlinear {
namespace split {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }
inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// One candidate tile configuration as the cost model sees it.
struct TileModel {
  int BD, BC, BK;        // output channels x input channels per tile; rows per k tile
  int blocks_per_sm;     // resident blocks per SM
  int threads;           // per block
  double macs_per_cycle; // per SM, effective, with >= 8 resident warps
  double block_cycles;   // fixed cost per block (prologue, epilogue)
  bool always_reduce;    // partials always go through the workspace (second kernel even at S = 1)
  double macs_per_element = 6.0;  // per (row, o, ci): 6, or 5 with the complex pair as three products
};

struct Plan {
  int cfg = 0;             // index into the models passed to make_plan
  int S = 0;               // row chunks (0: no configuration fits the grid limits)
  int64_t chunk_rows = 0;  // a multiple of the model's BK; every chunk non-empty
  int S_last = 0;          // split_last_tile: the last A tile's chunks (1 .. S), 0 when it has S like the others
  int64_t chunk_rows_last = 0;
};

constexpr int64_t kMinChunkRows = 256;  // a chunk amortises its prologue / partial store
constexpr int kMaxSplit = 1024;
constexpr int kMaxWaves = 8;

// Estimated time (ns): waves of resident blocks times the MAC time of the blocks an SM runs per wave
// (lower efficiency when an SM holds fewer than 8 warps), a fixed cost per block, and the traffic
// of the partials (written, read back) plus the second launch when there is one.
inline double estimate_ns(const TileModel& t, int64_t c, int64_t d, int sms, int S, int64_t chunk_kt) {
  const int64_t tiles = cdiv(d, t.BD) * cdiv(c, t.BC);
  const int64_t blocks = tiles * S;
  const int64_t waves = cdiv(blocks, int64_t(sms) * t.blocks_per_sm);
  const int64_t per_sm = blocks < int64_t(sms) * t.blocks_per_sm ? cdiv(blocks, sms) : t.blocks_per_sm;
  const int64_t warps = per_sm * t.threads / 32;
  const double occ_eff = warps >= 8 ? 1.0 : warps >= 4 ? 0.75 : 0.5;
  const double block_cycles =
      double(chunk_kt) * t.BK * t.BD * t.BC * t.macs_per_element / (t.macs_per_cycle * occ_eff) + t.block_cycles;
  const double main_ns = double(waves) * double(per_sm) * block_cycles / 1.7;  // ~1.7 GHz
  const double out_bytes = 16.0 * double(c) * double(d);  // 4 planes of FP32 partials
  const bool reduce = S > 1 || t.always_reduce;
  return main_ns + (reduce ? (2.0 * S + 1.0) * out_bytes / 2500.0 + 3000.0 : out_bytes / 2500.0);
}

// The best (configuration, S) by the estimate; ascending S with a 2% margin, so fewer chunks (less
// workspace) win when it hardly matters.
inline Plan make_plan(int64_t M, int64_t c, int64_t d, int sms, const TileModel* models, int n_models) {
  if (sms < 1) sms = 1;
  Plan best;
  double best_ns = -1.0;
  for (int i = 0; i < n_models; ++i) {
    const TileModel& t = models[i];
    if (cdiv(c, t.BC) > 65535) continue;  // gridDim.y limit
    const int64_t KT = cdiv(M, t.BK);
    const int64_t tiles = cdiv(d, t.BD) * cdiv(c, t.BC);
    // Split only while a chunk keeps >= kMinChunkRows rows and the grid stays within kMaxWaves
    // waves of resident blocks (beyond that the wave tail is small anyway, and the workspace grows).
    int64_t s_max = imin(imin(M / kMinChunkRows, int64_t(kMaxWaves) * sms * t.blocks_per_sm / tiles),
                         kMaxSplit);
    if (s_max < 1) s_max = 1;
    int last_S = 0;
    for (int64_t s = 1; s <= s_max; ++s) {
      const int64_t chunk_kt = cdiv(KT, s);
      const int S = int(cdiv(KT, chunk_kt));  // no empty chunk
      if (S == last_S) continue;
      last_S = S;
      const double ns = estimate_ns(t, c, d, sms, S, chunk_kt);
      if (best_ns < 0 || ns < 0.98 * best_ns) {
        best_ns = ns;
        best.cfg = i;
        best.S = S;
        best.chunk_rows = chunk_kt * t.BK;
      }
    }
  }
  return best;
}

// For a last A tile that takes about r of a full tile's time per row (the Hopper kernel's last o tile of
// 64 channels or fewer, e.g. ViT-B's d = 576: four of its eight consumer warps idle), in a plan that fits in
// one wave of `slots` blocks: the other A tiles take more row chunks and the last one fewer (S_last <= S), so
// that the blocks finish together in one wave, where the estimated time (the longest block's k tiles, the
// last tile's weighted by r) is at least 2% shorter than the uniform plan's. tiles_a: A tiles (>= 2),
// tiles_b: B tiles.
inline void split_last_tile(Plan& plan, int64_t M, int BK, int64_t tiles_a, int64_t tiles_b, int64_t slots,
                            double r) {
  if (tiles_a < 2 || plan.S < 1 || tiles_a * tiles_b * plan.S > slots) return;
  const int64_t KT = cdiv(M, BK), s_max = imin(imax(1, M / kMinChunkRows), kMaxSplit);
  double best = double(cdiv(KT, plan.S));
  for (int64_t s = plan.S; s <= s_max; ++s) {
    const int64_t kt_full = cdiv(KT, s), S_full = cdiv(KT, kt_full);
    const int64_t left = slots - (tiles_a - 1) * tiles_b * S_full;
    if (left < tiles_b) break;
    const int64_t kt_last = cdiv(KT, imin(left / tiles_b, S_full)), S_last = cdiv(KT, kt_last);
    const double t = kt_full > r * kt_last ? double(kt_full) : r * kt_last;
    if (t < 0.98 * best) {
      best = t;
      plan.S = int(S_full);
      plan.chunk_rows = kt_full * BK;
      plan.S_last = int(S_last);
      plan.chunk_rows_last = kt_last * BK;
    }
  }
}

// Workspace (bytes): S partial tiles [4][d][ldw] then S * bias_parts bias partials [d], FP32 (a kernel
// may split each chunk's bias sum over bias_parts blocks). 0 when unused.
inline size_t workspace_bytes(const Plan& plan, bool always_reduce, int64_t c, int64_t d, int64_t bias_parts = 1) {
  if (plan.S < 1 || (plan.S == 1 && !always_reduce)) return 0;
  return size_t(plan.S) * size_t(4 * d * round_up4(c) + bias_parts * d) * sizeof(float);
}

// The adjoint planes (eq_adjoint_tile.cuh) as extra blocks of the reduce launch, for the grad_x that follows
// (one launch less per backward): planes (4, d, c) -> adj (4, c, d) in the output's element type. Unused
// when adj == nullptr.
struct AdjointJob {
  const void* planes = nullptr;
  void* adj = nullptr;
};

// The rows of a last A tile with its own chunk count (Plan::S_last): o >= o_last take the first S partials and
// S_bias bias partials only (default: none).
struct LastTile {
  int o_last = 0x7fffffff, S = 0, S_bias = 0;
};

// Sums the S partial tiles in order z = 0 .. S-1, scales (planes 0 and 3 by s_real, 1 and 2 by
// s_cplx), converts to TOut and writes grad_planes (4, d, c) and, when out_bias != nullptr,
// grad_bias (d,) from the S_bias bias partials (in order); the rows and biases of `last` fewer. Blocks 0 ..
// rgx * rgy - 1 reduce: block (bx, by) = (b % rgx, b / rgx) of 256 threads as (kReduceX, kReduceY), x walking
// the float4 groups of a partial row (ldw / 4), y the 4 * d rows (g * d + o); the blocks with by == 0 also
// reduce grad_bias.
// The blocks after them make one adjoint tile each (job). vec_out: c % 4 == 0 and out aligned to 4
// elements, so each float4 group is one aligned vector store. Launched with programmatic dependent
// launch (eq_pdl.cuh): it waits for the kernel that wrote the partials before touching global memory.
constexpr int kReduceX = 64, kReduceY = 4;

template <class TOut>
__global__ void __launch_bounds__(kReduceX * kReduceY)
reduce_kernel(const float* __restrict__ ws, const float* __restrict__ ws_bias, TOut* __restrict__ out,
              TOut* __restrict__ out_bias, int S, int S_bias, int c, int d, int ldw, float s_real,
              float s_cplx, bool vec_out, int rgx, int rgy, LastTile last, AdjointJob job) {
  pdl_wait();
  const int tid = threadIdx.x;
  const int64_t b = blockIdx.x;
  if (b >= int64_t(rgx) * rgy) {  // an adjoint tile
    using U = std::conditional_t<sizeof(TOut) == 4, uint32_t, uint16_t>;
    __shared__ U buf[32][33];
    adjoint_planes_tile(static_cast<const U*>(job.planes), static_cast<U*>(job.adj), d, c, b - int64_t(rgx) * rgy,
                        buf, tid);
    return;
  }
  const int bx = int(b % rgx), by = int(b / rgx), tx = tid % kReduceX, ty = tid / kReduceX;
  const int n_row4 = ldw / 4;
  const int rows = 4 * d;
  const int64_t split_stride = 4 * int64_t(d) * ldw;  // floats between partials
  for (int row = by * kReduceY + ty; row < rows; row += rgy * kReduceY) {
    const int g = row / d;
    const float sc = (g == 0 || g == 3) ? s_real : s_cplx;
    const int Sr = row - g * d < last.o_last ? S : last.S;
    for (int c4 = bx * kReduceX + tx; c4 < n_row4; c4 += rgx * kReduceX) {
      const int ci = 4 * c4;
      const float* p = ws + int64_t(row) * ldw + ci;
      float4 s = *reinterpret_cast<const float4*>(p);
#pragma unroll 4  // loads in flight (ptxas's own unrolling spilled registers here)
      for (int z = 1; z < Sr; ++z) {
        const float4 v = *reinterpret_cast<const float4*>(p + z * split_stride);
        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
      }
      TOut r[4] = {from_float<TOut>(s.x * sc), from_float<TOut>(s.y * sc), from_float<TOut>(s.z * sc),
                   from_float<TOut>(s.w * sc)};
      TOut* const q = out + int64_t(row) * c + ci;
      if (vec_out) {  // ldw == c and ci + 3 < c
        if constexpr (sizeof(TOut) == 4) {
          *reinterpret_cast<float4*>(q) = *reinterpret_cast<const float4*>(r);
        } else {
          *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(r);
        }
      } else {  // ci < ldw and ldw < c + 4: ci < c
        q[0] = r[0];
        if (ci + 1 < c) q[1] = r[1];
        if (ci + 2 < c) q[2] = r[2];
        if (ci + 3 < c) q[3] = r[3];
      }
    }
  }
  if (out_bias != nullptr && by == 0) {
    for (int o = bx * (kReduceX * kReduceY) + tid; o < d; o += rgx * kReduceX * kReduceY) {
      float s = ws_bias[o];
      const int Sb = o >= last.o_last ? last.S_bias : S_bias;
      for (int z = 1; z < Sb; ++z) s += ws_bias[int64_t(z) * d + o];
      out_bias[o] = from_float<TOut>(s);
    }
  }
}

// Launches reduce_kernel with enough blocks to keep the memory system busy (a pure stream), and with job's
// adjoint tiles when job.adj != nullptr. S_bias: the bias partials, S when 0.
template <class TOut>
cudaError_t launch_reduce(const float* ws, const float* ws_bias, TOut* out, TOut* out_bias, int S, int c,
                          int d, int ldw, float s_real, float s_cplx, int sms, cudaStream_t stream,
                          int S_bias = 0, const AdjointJob& job = {}, const LastTile& last = {}) {
  const int64_t rgx = imin(cdiv(ldw / 4, kReduceX), 32);
  const int64_t rgy = imin(imin(cdiv(4 * int64_t(d), kReduceY), imax(1, int64_t(sms) * 16 / rgx)), 65535);
  const int64_t blocks = rgx * rgy + (job.adj != nullptr ? adjoint_planes_tiles(d, c) : 0);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const bool vec_out = c % 4 == 0 && reinterpret_cast<uintptr_t>(out) % (4 * sizeof(TOut)) == 0;
  return launch_maybe_pdl(dim3(unsigned(blocks)), dim3(kReduceX * kReduceY), 0, stream, reduce_kernel<TOut>, ws,
                          ws_bias, out, out_bias, S, S_bias > 0 ? S_bias : S, c, d, ldw, s_real, s_cplx, vec_out,
                          int(rgx), int(rgy), last, job);
}

}  // namespace split
}  // namespace flash_eqlinear
