// Fused p4 EQ-Linear forward, exact FP32 (plain FFMA, no TF32): see eq_linear_fwd.h for the math.
//
// One GEMM-shaped loop over the input channels k (rows m x output channels o) carries four
// operand pairs and four accumulators: a0 += f0 P0, a2 += f2 P2, aR += fR PR - fI PI,
// aI += fR PI + fI PR (6 FFMA per (m, o, k); the small4 tile; big and small: five, below). The DFT of x (f0, fR, fI, f2) is applied when a
// tile is staged into shared memory and the inverse DFT + bias in registers before the store, so
// x and y are read / written in their interleaved layout with no extra pass over memory.
//
// The big and small tiles (NP = 5 planes per stage) take the complex term as three real products
// (Gauss): k1 += (fR + fI) PR, k2 += fR (PI - PR), k3 += fI (PR + PI), then aR = k1 - k3 and
// aI = k1 + k2: 5 FFMA per (m, o, k) instead of 6, for a fifth operand plane on each side
// (s = fR + fI made by the x transform, PI - PR and PR + PI by the threads that stage PR and PI)
// and a fifth accumulator set. It is still FP32 arithmetic throughout; the rounding error measured
// the same as the four-product form's, and the time less where the FFMAs set the pace (c >= 512).
// The four-block small4 tile keeps four products: at 128 registers the fifth set costs more than it
// saves (measurements: docs/kernels.md, Exact FP32 forward).
//
// Tiling (TileCfg): a block computes BM rows x BN output channels with WM x WN warps of 4 x 8
// lanes; a lane owns TM rows x TN channels as float4 groups (rows r0 + 16q + 0..3, channels
// n0 + 32q + 0..3), i.e. NP * TM * TN accumulators (NP = 4 or 5 planes, below).
//   big:   4 x 2 warps, 8 x 4 per lane -> 128 x 64 tile, 256 threads, 160 accumulators/lane,
//          15 LDS.128 per 160 FFMA, one block (8 warps) per SM.
//   small: 4 x 1 warps, 4 x 4 per lane ->  64 x 32 tile, 128 threads, three blocks per SM: for
//          grids that would fill the GPU poorly with the big tile (small M, small d).
//   small4: the small tile at four blocks per SM (<= 128 registers) with four products, for short
//          K (c <= 256), where the blocks hide each other's fill, k-tile barriers and epilogue
//          (there it beats the small tile with four products; at c = 512 the big tile with five beats it).
// Blocks walk the (M tile, d tile) grid in groups of kGroupM M tiles for L2 reuse.
//
// Shared memory (dynamic), two stages, k-major so that a k step reads rows / channels as float4:
//   As[2][NP][BK][BM + 4]  f0, fR, fI, f2 (, fR + fI) of the x tile          (As[s][g][k][m])
//   Bs[2][NP][BK][BN + 4]  P0, PR, PI, P2, or P0, PR, PI - PR, P2, PR + PI   (Bs[s][g][k][o])
//   raw[slots][threads]   float4 landing slots of cp.async, private to each thread
// The +4 padding makes the transposed scalar stores conflict-free (the 8 k of a row land 4 banks
// apart, the two float4 halves of a plane row 16 banks apart) and keeps float4 reads aligned.
//
// Pipeline per k tile: issue cp.async of tile k+1 into raw; FFMAs on stage k (fragments double
// buffered in registers with four products; with five there are no registers left for that);
// wait for the own copies, transform x, store both operands transposed into the other stage; one
// __syncthreads.
//
// Ragged edges: rows >= M and channels >= d are clamped to the last valid one when loading (their
// accumulators are garbage but never stored); input channels >= c are zero-filled in both
// operands, since they feed every output. Global offsets are 64-bit.

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "eq_fp32_tile.cuh"
#include "eq_func_attr.cuh"
#include "eq_linear_fwd.h"
#include "eq_p4_transform.cuh"
#include "eq_pdl.cuh"
#include "eq_switches.h"

namespace flash_eqlinear {
namespace {

template <int WM_, int WN_, int TM_, int TN_, int BK_, int kMinBlocks_, int NP_ = 4>
struct TileCfg {
  static constexpr int WM = WM_, WN = WN_;  // warps along rows, along output channels
  static constexpr int TM = TM_, TN = TN_;  // per-lane micro-tile
  static constexpr int BK = BK_;            // input channels per k tile
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int BM = WM * 4 * TM;
  static constexpr int BN = WN * 8 * TN;
  static constexpr int SA = BM + 4;
  static constexpr int SB = BN + 4;
  // Operand planes per stage: 4, or 5 with the three-product complex term (kGauss below).
  static constexpr int NP = NP_;
  static constexpr bool kGauss = NP == 5;
  static constexpr int kAStage = NP * BK * SA;  // floats
  static constexpr int kBStage = NP * BK * SB;
  // Staging maps, per k tile. KH = BK / 8 halves of 8 channels.
  // x: thread t copies the float4 x[row][k0 + t % 8 + 8h] for rows t / 8 + i * XRS (i < XL):
  //    8 lanes cover 128 contiguous bytes of a row.
  // planes: thread t copies the float4 P[g][o][k0 + 4 * (t % 2 + 2h) .. +3] for o = (t / 2) % BN,
  //    g = t / (2 * BN) + i * GSTEP (i < PL): 2 lanes cover 32 contiguous bytes of a plane row.
  static constexpr int KH = BK / 8;
  static constexpr int XRS = kThreads / 8;
  static constexpr int XL = BM / XRS;
  static constexpr int GSTEP = kThreads / (2 * BN);
  static constexpr int PL = 4 / GSTEP;
  // Two operand stages plus the raw cp.async landing slots ((XL + PL) * KH float4s per thread).
  static constexpr int kRawSlots = (XL + PL) * KH;
  static constexpr int kSmemBytes =
      2 * (kAStage + kBStage) * int(sizeof(float)) + kRawSlots * kThreads * 16;

  static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tile is read as float4 groups");
  static_assert(BM % 32 == 0 && BN % 32 == 0, "bank analysis of the padded strides assumes this");
  static_assert(BK % 8 == 0, "k tile is a whole number of 8-channel halves");
  static_assert(BM % XRS == 0, "x staging map");
  static_assert(kThreads % (2 * BN) == 0 && 4 % GSTEP == 0, "plane staging map");
  static_assert(NP == 4 || (NP == 5 && GSTEP == 2), "kGauss: a thread stages the plane pair (P0, P2) or (PR, PI)");
};

using BigCfg = TileCfg<4, 2, 8, 4, 8, 1, 5>;    // 128 x 64, 255 registers: one block per SM
using SmallCfg = TileCfg<4, 1, 4, 4, 8, 3, 5>;  //  64 x 32, ~160 registers: three blocks per SM
// The small tile with four products, capped at 128 registers (no spills): four blocks = 16 warps per
// SM. Short K is latency-bound, so the extra warps win there.
using Small4Cfg = TileCfg<4, 1, 4, 4, 8, 4>;

// M tiles processed together (across all d tiles) so that x rows and plane slices of the blocks
// resident at one time stay in L2 instead of x being re-read from DRAM once per d tile.
constexpr int kGroupM = 8;

// cp.async with zero fill: when !valid nothing is read (src-size 0) and the slot becomes 0.
// Asynchronous copies keep the next tile's loads in flight during the FFMAs without holding
// registers; with register staging the compiler sank the loads below the math, exposing latency.
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// kVecX: x and y are 16-byte aligned (float4 per (row, channel)).
// kVecP: planes 16-byte aligned and c % 4 == 0 (float4 along c).
template <class Cfg, bool kVecX, bool kVecP>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
eq_linear_fwd_fp32_kernel(const float* __restrict__ x, const float* __restrict__ planes,
                          const float* __restrict__ bias, float* __restrict__ y,
                          int64_t M, int c, int d) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, SA = Cfg::SA, SB = Cfg::SB;
  constexpr int TM = Cfg::TM, TN = Cfg::TN;
  constexpr int XL = Cfg::XL, XRS = Cfg::XRS, KH = Cfg::KH, PL = Cfg::PL, GSTEP = Cfg::GSTEP;
  pdl_wait();  // eq_pdl.cuh: no global memory is touched before this

  extern __shared__ float4 smem4[];  // float4: 16-byte alignment for the vector reads
  float* const As = reinterpret_cast<float*>(smem4);
  float* const Bs = As + 2 * Cfg::kAStage;

  // Grouped tile order: consecutive linear block ids walk kGroupM M tiles, then the next d tile.
  const int64_t num_m = gridDim.x, num_n = gridDim.y;
  const int64_t lin = int64_t(blockIdx.y) * num_m + blockIdx.x;
  const int64_t group_size = int64_t(kGroupM) * num_n;
  const int64_t first_m = lin / group_size * kGroupM;
  const int64_t rows_in_group = min(num_m - first_m, int64_t(kGroupM));
  const int64_t in_group = lin - first_m * num_n;  // lin % group_size
  const int64_t m0 = (first_m + in_group % rows_in_group) * BM;
  const int n0 = int(in_group / rows_in_group) * BN;

  const int tid = threadIdx.x;

  // ---- global -> shared staging maps (fixed for the whole k loop)
  const int xk = tid % 8;
  const float* xp[XL];
  #pragma unroll
  for (int i = 0; i < XL; ++i) {
    const int64_t r = min(m0 + tid / 8 + i * XRS, M - 1);
    xp[i] = x + (r * c + xk) * 4;
  }
  const int pkq = (tid % 2) * 4;
  const int pol = (tid / 2) % BN;
  const int pg0 = tid / (2 * BN);
  const float* pp;
  {
    const int64_t o = min(n0 + pol, d - 1);
    pp = planes + (int64_t(pg0) * d + o) * c + pkq;
  }
  // Between the PL planes a thread loads; kGauss: (P0, P2) for pg0 = 0, (PR, PI) for pg0 = 1.
  const int64_t gstride = (Cfg::kGauss ? int64_t(3 - 2 * pg0) : int64_t(GSTEP)) * d * c;

  // Raw tile staging (cp.async): slot s of thread t is raw[s * kThreads + t]; x float4 (i, h)
  // in slot i * KH + h, plane float4 (i, h) in slot (XL + i) * KH + h. Each thread reads back only
  // what it copied itself, so its own cp.async.wait_group suffices: no extra barrier.
  float4* const raw = reinterpret_cast<float4*>(Bs + 2 * Cfg::kBStage) + tid;

  auto issue_tile = [&](int k0) {
    #pragma unroll
    for (int h = 0; h < KH; ++h) {
      const int kx = k0 + xk + 8 * h;
      const bool xok = kx < c;
      #pragma unroll
      for (int i = 0; i < XL; ++i) {
        const float* src = xp[i] + int64_t(k0 + 8 * h) * 4;
        float* const dst = reinterpret_cast<float*>(raw + (i * KH + h) * Cfg::kThreads);
        if (kVecX) {
          cp_async16(dst, xok ? src : x, xok);
        } else {
          #pragma unroll
          for (int e = 0; e < 4; ++e) cp_async4(dst + e, xok ? src + e : x, xok);
        }
      }
      const int kp = k0 + pkq + 8 * h;
      #pragma unroll
      for (int i = 0; i < PL; ++i) {
        const float* src = pp + i * gstride + k0 + 8 * h;
        float* const dst = reinterpret_cast<float*>(raw + ((XL + i) * KH + h) * Cfg::kThreads);
        if (kVecP) {
          cp_async16(dst, kp < c ? src : planes, kp < c);
        } else {
          #pragma unroll
          for (int e = 0; e < 4; ++e) cp_async4(dst + e, kp + e < c ? src + e : planes, kp + e < c);
        }
      }
    }
    cp_async_commit();
  };

  // Waits for this thread's copies, applies the forward DFT to x (the prologue) and stores both
  // operands transposed into stage `buf`.
  auto stage_tile = [&](int buf) {
    cp_async_wait_all();
    float* const A = As + buf * Cfg::kAStage + xk * SA + tid / 8;
    float* const B = Bs + buf * Cfg::kBStage + pg0 * BK * SB + pkq * SB + pol;
    #pragma unroll
    for (int h = 0; h < KH; ++h) {
      #pragma unroll
      for (int i = 0; i < XL; ++i) {
        const float4 v = raw[(i * KH + h) * Cfg::kThreads];
        float* const a = A + 8 * h * SA + i * XRS;
        float f0, fr, fi, f2;
        dft4<false>(v.x, v.y, v.z, v.w, f0, fr, fi, f2);
        a[0 * BK * SA] = f0;
        a[1 * BK * SA] = fr;
        a[2 * BK * SA] = fi;
        a[3 * BK * SA] = f2;
        if constexpr (Cfg::kGauss) a[4 * BK * SA] = fr + fi;
      }
      if constexpr (Cfg::kGauss) {
        const float4 u = raw[(XL * KH + h) * Cfg::kThreads], w = raw[((XL + 1) * KH + h) * Cfg::kThreads];
        const float uv[4] = {u.x, u.y, u.z, u.w}, wv[4] = {w.x, w.y, w.z, w.w};
        float* const b = Bs + buf * Cfg::kBStage + pkq * SB + pol + 8 * h * SB;
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (pg0 == 0) {  // u = P0, w = P2
            b[e * SB] = uv[e];
            b[3 * BK * SB + e * SB] = wv[e];
          } else {  // u = PR, w = PI
            b[1 * BK * SB + e * SB] = uv[e];
            b[2 * BK * SB + e * SB] = wv[e] - uv[e];
            b[4 * BK * SB + e * SB] = uv[e] + wv[e];
          }
        }
      } else {
        #pragma unroll
        for (int i = 0; i < PL; ++i) {
          const float4 v = raw[((XL + i) * KH + h) * Cfg::kThreads];
          float* const b = B + i * GSTEP * BK * SB + 8 * h * SB;
          b[0 * SB] = v.x;
          b[1 * SB] = v.y;
          b[2 * SB] = v.z;
          b[3 * SB] = v.w;
        }
      }
    }
  };

  // ---- compute-side map
  const int warp = tid / 32, lane = tid % 32;
  // Lane -> (row group lr in 0..3, channel group lc in 0..7). Shared memory returns 128 B per
  // cycle, so an LDS.128 takes 4 wavefronts unless lane pairs (l, l^1) or (l, l^2) read the same
  // address, then 2: lc = lane bits 1..3 pairs l^1 for the B reads, lr = lane bits 0 and 4 pairs
  // l^2 for the A reads (halves the shared-memory wavefronts of the k loop).
  const int lr = (lane & 1) | ((lane >> 3) & 2);
  const int lc = (lane >> 1) & 7;
  const int a_off = (warp % Cfg::WM) * (4 * TM) + lr * 4;  // first row of the lane
  const int b_off = (warp / Cfg::WM) * (8 * TN) + lc * 4;  // first channel of the lane

  // kGauss: accR, accI, accK hold k1 = sum (fR + fI) PR, k2 = sum fR (PI - PR), k3 = sum fI (PR + PI);
  // aR = k1 - k3, aI = k1 + k2 (5 FFMA per (row, channel, k) instead of 6).
  float acc0[TM][TN], acc2[TM][TN], accR[TM][TN], accI[TM][TN], accK[Cfg::kGauss ? TM : 1][Cfg::kGauss ? TN : 1];
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    #pragma unroll
    for (int j = 0; j < TN; ++j) {
      acc0[i][j] = acc2[i][j] = accR[i][j] = accI[i][j] = 0.f;
      if constexpr (Cfg::kGauss) accK[i][j] = 0.f;
    }
  }

  const int KT = (c + BK - 1) / BK;
  issue_tile(0);
  stage_tile(0);
  __syncthreads();

  for (int kt = 0; kt < KT; ++kt) {
    const bool more = kt + 1 < KT;
    if (more) issue_tile((kt + 1) * BK);  // in flight during the FFMAs below

    const float* const A = As + (kt & 1) * Cfg::kAStage + a_off;
    const float* const B = Bs + (kt & 1) * Cfg::kBStage + b_off;
    // Plane g of step k: the lane's TM rows of A (float4 groups 16 apart), TN channels of B (32 apart).
    auto frag_a = [&](float (&dst)[TM], int g, int k) { load_float4s(dst, A + (g * BK + k) * SA, 16); };
    auto frag_b = [&](float (&dst)[TN], int g, int k) { load_float4s(dst, B + (g * BK + k) * SB, 32); };
    if constexpr (Cfg::kGauss) {
      // Five planes per k, single-buffered (the fifth accumulator set takes the registers).
      #pragma unroll
      for (int k = 0; k < BK; ++k) {
        float a[5][TM], b[5][TN];
        #pragma unroll
        for (int g = 0; g < 5; ++g) {
          frag_a(a[g], g, k);
          frag_b(b[g], g, k);
        }
        outer_fma(acc0, a[0], b[0], 1.f);  // a0 += f0 P0
        outer_fma(accR, a[4], b[1], 1.f);  // k1 += (fR + fI) PR
        outer_fma(accI, a[1], b[2], 1.f);  // k2 += fR (PI - PR)
        outer_fma(accK, a[2], b[4], 1.f);  // k3 += fI (PR + PI)
        outer_fma(acc2, a[3], b[3], 1.f);  // a2 += f2 P2
      }
    } else {
      // Fragments [slot][g][.] with g = 0..3 for f0/P0, fR/PR, fI/PI, f2/P2. Explicit double
      // buffering (step k + 1 is read while step k is multiplied) hides the LDS latency with only
      // two warps per scheduler; it measured faster than leaving the schedule to the compiler
      // (docs/kernels.md, Exact FP32 forward).
      float a[2][4][TM], b[2][4][TN];
      auto load_frag = [&](int slot, int k) {
        #pragma unroll
        for (int g = 0; g < 4; ++g) {
          frag_a(a[slot][g], g, k);
          frag_b(b[slot][g], g, k);
        }
      };
      load_frag(0, 0);
      #pragma unroll
      for (int k = 0; k < BK; ++k) {
        const int s = k & 1;
        if (k + 1 < BK) load_frag(s ^ 1, k + 1);
        outer_fma(acc0, a[s][0], b[s][0], 1.f);   // a0 += f0 P0
        outer_fma(accR, a[s][1], b[s][1], 1.f);   // aR += fR PR
        outer_fma(accI, a[s][1], b[s][2], 1.f);   // aI += fR PI
        outer_fma(accR, a[s][2], b[s][2], -1.f);  // aR -= fI PI
        outer_fma(accI, a[s][2], b[s][1], 1.f);   // aI += fI PR
        outer_fma(acc2, a[s][3], b[s][3], 1.f);   // a2 += f2 P2
      }
    }

    if (more) {
      // The other stage was last read in iteration kt - 1, before the barrier that ended it; the
      // raw slots were last read back before that barrier too.
      stage_tile((kt + 1) & 1);
      __syncthreads();
    }
  }

  // ---- epilogue: inverse DFT + bias, one float4 (the 4 group copies) per (row, channel)
  float bv[TN];
  #pragma unroll
  for (int j = 0; j < TN; ++j) {
    const int o = n0 + b_off + (j / 4) * 32 + j % 4;
    bv[j] = (bias != nullptr && o < d) ? __ldg(bias + o) : 0.f;
  }
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t m = m0 + a_off + (i / 4) * 16 + i % 4;
    if (m >= M) continue;
    float* const yrow = y + m * d * 4;
    #pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int o = n0 + b_off + (j / 4) * 32 + j % 4;
      if (o >= d) continue;
      float ar = accR[i][j], ai = accI[i][j];
      if constexpr (Cfg::kGauss) {
        ai = accR[i][j] + accI[i][j];
        ar = accR[i][j] - accK[i][j];
      }
      const float4 out = inverse_dft4_f32(acc0[i][j], acc2[i][j], ar, ai, bv[j]);
      float* const dst = yrow + int64_t(o) * 4;
      if (kVecX) {
        *reinterpret_cast<float4*>(dst) = out;
      } else {
        dst[0] = out.x; dst[1] = out.y; dst[2] = out.z; dst[3] = out.w;
      }
    }
  }
}

template <class Cfg, bool kVecX, bool kVecP>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
  auto* kernel = eq_linear_fwd_fp32_kernel<Cfg, kVecX, kVecP>;
  if (Cfg::kSmemBytes > 48 * 1024) {
    const cudaError_t err =
        set_max_dynamic_smem(kernel, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const int64_t grid_m = (p.M + Cfg::BM - 1) / Cfg::BM;
  const int64_t grid_n = (p.d + Cfg::BN - 1) / Cfg::BN;
  if (grid_m > INT_MAX || grid_n > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid{unsigned(grid_m), unsigned(grid_n)};
  return launch_maybe_pdl(grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, kernel,
                          static_cast<const float*>(p.x), static_cast<const float*>(p.planes),
                          static_cast<const float*>(p.bias), static_cast<float*>(p.y), p.M, int(p.c), int(p.d));
}

template <class Cfg>
cudaError_t dispatch_vec(const FwdParams& p, bool vec_x, bool vec_p, cudaStream_t stream) {
  if (!vec_x) return launch<Cfg, false, false>(p, stream);  // rare (offset views): all scalar
  return vec_p ? launch<Cfg, true, true>(p, stream) : launch<Cfg, true, false>(p, stream);
}

// Resident blocks per SM of a configuration on the current device.
template <class Cfg>
int blocks_per_sm() {
  return resident_blocks_per_sm(eq_linear_fwd_fp32_kernel<Cfg, true, true>, Cfg::kThreads, Cfg::kSmemBytes);
}

constexpr int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Rough time of a configuration in units of (tile outputs / relative throughput): waves of
// resident blocks times the work an SM does per wave. Captures wave quantization and tile
// padding waste, which are what decide between the two tiles for c > kSmallMaxC.
template <class Cfg>
double cost(int64_t M, int64_t d, int sms, int occ, double rel_speed) {
  const int64_t blocks = ((M + Cfg::BM - 1) / Cfg::BM) * ((d + Cfg::BN - 1) / Cfg::BN);
  const int64_t slots = int64_t(sms) * occ;
  const int64_t waves = (blocks + slots - 1) / slots;
  const int64_t per_sm = imin(occ, (blocks + sms - 1) / sms);  // blocks per SM per wave
  return double(waves) * double(per_sm) * Cfg::BM * Cfg::BN / rel_speed;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// Input channels up to which the four-block small tile runs whatever the grid.
constexpr int64_t kSmallMaxC = 256;

// FLASH_EQLINEAR_DEBUG fp32_tile=big|small|small4 forces a tile configuration (to test and time each); 0 when
// unset: the shape rule decides.
char forced_tile() {
  const char* v = debug_switch("fp32_tile");
  if (v == nullptr) return 0;
  if (std::strcmp(v, "big") == 0) return 'b';
  if (std::strcmp(v, "small") == 0) return 's';
  if (std::strcmp(v, "small4") == 0) return '4';
  return 0;
}

}  // namespace

cudaError_t eq_linear_fwd_fp32(const FwdParams& p, cudaStream_t stream) {
  if (p.gelu || p.y_f32 || p.x_parts != 1 || p.y_parts != 1) return cudaErrorNotSupported;
  if (p.M < 0 || p.c < 1 || p.d < 1) return cudaErrorInvalidValue;
  if (p.M == 0) return cudaSuccess;
  // Channel indices are int inside the kernel (k0 + BK and n0 + BN must not overflow).
  if (p.c > INT_MAX - 1024 || p.d > INT_MAX - 1024) return cudaErrorInvalidValue;
  if (p.x == nullptr || p.planes == nullptr || p.y == nullptr) return cudaErrorInvalidValue;

  const bool vec_x = aligned16(p.x) && aligned16(p.y);
  const bool vec_p = aligned16(p.planes) && p.c % 4 == 0;

  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;

  switch (forced_tile()) {
    case 'b': return dispatch_vec<BigCfg>(p, vec_x, vec_p, stream);
    case 's': return dispatch_vec<SmallCfg>(p, vec_x, vec_p, stream);
    case '4': return dispatch_vec<Small4Cfg>(p, vec_x, vec_p, stream);
    default: break;
  }
  // The big tile does ~1.25x the work per SM-cycle of the small one at long K (more FFMA per
  // shared load, more ILP); the small tile wins when the big grid fills the GPU poorly or d is
  // small; at short K the four-block small tile beats both (measured up to c = 256: docs/kernels.md,
  // Exact FP32 forward).
  if (p.c <= kSmallMaxC) return dispatch_vec<Small4Cfg>(p, vec_x, vec_p, stream);
  const double big = cost<BigCfg>(p.M, p.d, sms, blocks_per_sm<BigCfg>(), 1.0);
  const double small = cost<SmallCfg>(p.M, p.d, sms, blocks_per_sm<SmallCfg>(), 0.8);
  if (big < small) return dispatch_vec<BigCfg>(p, vec_x, vec_p, stream);
  return dispatch_vec<SmallCfg>(p, vec_x, vec_p, stream);
}

}  // namespace flash_eqlinear
