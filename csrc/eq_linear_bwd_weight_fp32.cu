// Fused p4 EQ-Linear weight backward, exact FP32 (plain FFMA, no TF32): see eq_linear_bwd_weight.h
// for the math.
//
// GEMM view: the output tile is BD output channels o x BC input channels ci, the reduction (k)
// runs over rows m, with the DFT of grad_y (g0, gR, gI, g2) and of x (f0, fR, fI, f2):
//   P0 = sum g0 f0   PR = sum gR fR + gI fI   PI = sum gI fR - gR fI   P2 = sum g2 f2.
// The complex pair (g times conj f) is taken as three real products (Gauss), k1 = sum (gR + gI) fR,
// k2 = -sum gR (fR + fI), k3 = sum gI (fR - fI), PR = k1 - k3, PI = k1 + k2: 5 FFMA per (m, o, ci)
// instead of 6, for five operand planes per side, A = (g0, gR, gI, g2, gR + gI) and
// B = (f0, fR, -(fR + fI), f2, fR - fI), and five accumulator sets (less time than the four-product
// form, the same relative error: docs/kernels.md, Exact FP32 weight gradient). Both operands are
// contiguous along channels for a fixed row, so a k tile of BK rows is loaded as one float4 (the 4
// group copies) per (row, channel) and staged into shared memory as [5][BK][BD] and [5][BK][BC] with
// the DFT applied on the way: m is already the outer index, so nothing is transposed and consecutive
// lanes store consecutive floats (no padding).
//
// Tiling (TileCfg): WM x WN warps of 4 x 8 lanes; a lane owns TM output channels x TN input
// channels as float4 groups (o = o0 + 16q + 0..3, ci = c0 + 32q + 0..3), 5 * TM * TN accumulators.
//   big:   4 x 2 warps, 8 x 4 per lane -> 128 x 64 tile, 256 threads, one block per SM.
//   small: 4 x 1 warps, 4 x 4 per lane ->  64 x 32 tile, 128 threads, for small c or d.
// Staging maps: thread t loads grad_y channel o0 + t % BD for rows t / BD + i * (kThreads / BD)
// and x channel c0 + t % BC for rows t / BC + i * (kThreads / BC), so the BD (BC) lanes of a row
// read 16 * BD (16 * BC) contiguous bytes, and each thread always sees the same output channel,
// which lets it sum g0 for grad_bias on the side (one FADD per grad_y float4).
//
// Pipeline per k tile, as in the forward: cp.async of tile k+1 into per-thread landing slots;
// FFMAs on stage k; wait for the own copies, transform, store into the other stage; one
// __syncthreads.
//
// Split over M (gridDim.z = S chunks of chunk_rows rows, a multiple of BK): d x c tiles alone do
// not fill the GPU for moderate sizes (c = d = 512: 32 tiles of 128 x 64 for 132 SMs). Block z
// writes its unscaled partial tile to workspace[z][4][d][ldw] (ldw = c rounded up to 4, so partial
// rows are float4 aligned) with plain stores, and the blocks of the first c-tile column write their
// grad_bias partial to workspace_bias[z][d]. A second kernel sums the S partials in order z = 0..S-1,
// applies 1/2 and 1/sqrt2 and writes grad_planes / grad_bias: deterministic, no atomics. With
// S == 1 the main kernel applies the scales and writes the outputs itself.
//
// Ragged edges: rows outside the block's chunk (and >= M) and channels >= d or >= c are zero-filled
// by the cp.async (src-size 0), so they add nothing to any sum; stores are masked. Row offsets are
// 64-bit; channel indices are int (the host checks c, d <= INT_MAX / 4 - 1024).

#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "eq_fp32_tile.cuh"
#include "eq_func_attr.cuh"
#include "eq_linear_bwd_weight.h"
#include "eq_linear_bwd_weight_split.cuh"
#include "eq_plane_blocks.h"
#include "eq_p4_transform.cuh"

namespace flash_eqlinear {
namespace {

template <int WM_, int WN_, int TM_, int TN_, int BK_, int kMinBlocks_>
struct TileCfg {
  static constexpr int WM = WM_, WN = WN_;  // warps along output channels, along input channels
  static constexpr int TM = TM_, TN = TN_;  // per-lane micro-tile
  static constexpr int BK = BK_;            // rows per k tile
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int BD = WM * 4 * TM;  // output channels per tile
  static constexpr int BC = WN * 8 * TN;  // input channels per tile
  static constexpr int kAStage = 5 * BK * BD;  // floats: five operand planes per stage
  static constexpr int kBStage = 5 * BK * BC;
  // Staging maps (see the file comment): GRS / XRS rows per pass, GL / XL float4 per thread.
  static constexpr int GRS = kThreads / BD;
  static constexpr int GL = BK / GRS;
  static constexpr int XRS = kThreads / BC;
  static constexpr int XL = BK / XRS;
  static constexpr int kRawSlots = GL + XL;
  // Two operand stages, kThreads floats for the grad_bias combine, the cp.async landing slots.
  static constexpr int kSmemFloats = 2 * (kAStage + kBStage) + kThreads;
  static constexpr int kSmemBytes = kSmemFloats * int(sizeof(float)) + kRawSlots * kThreads * 16;

  static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tile is read as float4 groups");
  static_assert(kThreads % BD == 0 && BK % GRS == 0, "grad_y staging map");
  static_assert(kThreads % BC == 0 && BK % XRS == 0, "x staging map");
  static_assert(kSmemFloats % 4 == 0, "landing slots must stay 16-byte aligned");
};

using BigCfg = TileCfg<4, 2, 8, 4, 8, 1>;    // 128 x 64, one block per SM
using SmallCfg = TileCfg<4, 1, 4, 4, 8, 3>;  //  64 x 32, up to three blocks per SM
static_assert(BigCfg::BK == SmallCfg::BK, "the split plan assumes one k tile height");
constexpr int kBK = BigCfg::BK;

// cp.async with zero fill: when !valid nothing is read (src-size 0) and the slot becomes 0.
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

constexpr float kInvSqrt2 = 0.70710678118654752440f;

// kVec: x and gy 16-byte aligned (one float4 per (row, channel)); otherwise 4 scalar copies.
// dst: grad_planes (direct, S == 1: scaled, leading dimension ld = c) or the workspace (split:
// unscaled partials, ld = ldw, block z at dst + z * 4 * d * ld). vec_dst: float4 stores allowed
// (dst 16-byte aligned and ld % 4 == 0). bias_dst: grad_bias (direct) / bias partials [z][d]
// (split), or nullptr.
template <class Cfg, bool kVec>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
eq_linear_bwd_weight_fp32_kernel(const float* __restrict__ x, const float* __restrict__ gy,
                                 float* __restrict__ dst, float* __restrict__ bias_dst,
                                 int64_t M, int c, int d, int64_t chunk_rows, int ld,
                                 bool direct, bool vec_dst) {
  constexpr int BD = Cfg::BD, BC = Cfg::BC, BK = Cfg::BK;
  constexpr int TM = Cfg::TM, TN = Cfg::TN;
  constexpr int GRS = Cfg::GRS, GL = Cfg::GL, XRS = Cfg::XRS, XL = Cfg::XL;

  extern __shared__ float4 smem4[];  // float4: 16-byte alignment for the vector reads
  float* const As = reinterpret_cast<float*>(smem4);  // [2][5][BK][BD]  g0, gR, gI, g2, gR + gI
  float* const Bs = As + 2 * Cfg::kAStage;             // [2][5][BK][BC]  f0, fR, -(fR + fI), f2, fR - fI
  float* const red = Bs + 2 * Cfg::kBStage;            // [kThreads]      grad_bias combine

  const int o0 = int(blockIdx.x) * BD;
  const int c0 = int(blockIdx.y) * BC;
  const int64_t mb = int64_t(blockIdx.z) * chunk_rows;  // this block's rows: [mb, me)
  const int64_t me = min(M, mb + chunk_rows);
  const int tid = threadIdx.x;

  // ---- global -> shared staging maps (fixed for the whole k loop)
  const int go = tid % BD, gk = tid / BD;  // grad_y: channel o0 + go, rows gk + i * GRS
  const int xc = tid % BC, xk = tid / BC;  // x:      channel c0 + xc, rows xk + i * XRS
  const bool g_chan_ok = o0 + go < d;
  const bool x_chan_ok = c0 + xc < c;
  const int64_t g_row = int64_t(d) * 4;  // floats between rows
  const int64_t x_row = int64_t(c) * 4;
  // First element this thread copies (row mb + gk / mb + xk); only dereferenced when valid.
  const float* const g_src0 = gy + (mb + gk) * g_row + int64_t(o0 + go) * 4;
  const float* const x_src0 = x + (mb + xk) * x_row + int64_t(c0 + xc) * 4;

  // Landing slot s of thread t is raw[s * kThreads + t]: grad_y float4 i in slot i, x float4 i
  // in slot GL + i. Each thread reads back only what it copied itself, so its own
  // cp.async.wait_group suffices: no extra barrier.
  float4* const raw = reinterpret_cast<float4*>(red + Cfg::kThreads) + tid;

  auto issue_tile = [&](int kt) {
    const int64_t r0 = int64_t(kt) * BK;  // row offset of the tile within the chunk
    const int64_t rem = me - mb - r0;     // rows of the tile that belong to the chunk (>= 1)
    #pragma unroll
    for (int i = 0; i < GL; ++i) {
      const bool ok = g_chan_ok && gk + i * GRS < rem;
      const float* src = g_src0 + (r0 + i * GRS) * g_row;
      float* const s = reinterpret_cast<float*>(raw + i * Cfg::kThreads);
      if (kVec) {
        cp_async16(s, ok ? src : gy, ok);
      } else {
        #pragma unroll
        for (int e = 0; e < 4; ++e) cp_async4(s + e, ok ? src + e : gy, ok);
      }
    }
    #pragma unroll
    for (int i = 0; i < XL; ++i) {
      const bool ok = x_chan_ok && xk + i * XRS < rem;
      const float* src = x_src0 + (r0 + i * XRS) * x_row;
      float* const s = reinterpret_cast<float*>(raw + (GL + i) * Cfg::kThreads);
      if (kVec) {
        cp_async16(s, ok ? src : x, ok);
      } else {
        #pragma unroll
        for (int e = 0; e < 4; ++e) cp_async4(s + e, ok ? src + e : x, ok);
      }
    }
    cp_async_commit();
  };

  float bsum = 0.f;  // sum of g0 over this thread's rows (channel o0 + go)

  // Waits for this thread's copies, applies the DFT and stores both operands into stage `buf`.
  auto stage_tile = [&](int buf) {
    cp_async_wait_all();
    float* const A = As + buf * Cfg::kAStage + gk * BD + go;
    #pragma unroll
    for (int i = 0; i < GL; ++i) {
      const float4 v = raw[i * Cfg::kThreads];
      float g0, gr, gi, g2;
      dft4<false>(v.x, v.y, v.z, v.w, g0, gr, gi, g2);
      float* const a = A + i * GRS * BD;
      a[0 * BK * BD] = g0;
      a[1 * BK * BD] = gr;
      a[2 * BK * BD] = gi;
      a[3 * BK * BD] = g2;
      a[4 * BK * BD] = gr + gi;
      bsum += g0;
    }
    float* const B = Bs + buf * Cfg::kBStage + xk * BC + xc;
    #pragma unroll
    for (int i = 0; i < XL; ++i) {
      const float4 v = raw[(GL + i) * Cfg::kThreads];
      const float s02 = v.x + v.z, s13 = v.y + v.w, fr = v.x - v.z, fi = v.w - v.y;
      float* const b = B + i * XRS * BC;
      b[0 * BK * BC] = s02 + s13;  // f0
      b[1 * BK * BC] = fr;
      b[2 * BK * BC] = -(fr + fi);
      b[3 * BK * BC] = s02 - s13;  // f2
      b[4 * BK * BC] = fr - fi;
    }
  };

  // ---- compute-side map (as in the forward): lane -> (o group lr in 0..3, ci group lc in 0..7),
  // chosen so that lane pairs share LDS.128 addresses (fewer shared-memory wavefronts).
  const int warp = tid / 32, lane = tid % 32;
  const int lr = (lane & 1) | ((lane >> 3) & 2);
  const int lc = (lane >> 1) & 7;
  const int a_off = (warp % Cfg::WM) * (4 * TM) + lr * 4;  // first output channel of the lane
  const int b_off = (warp / Cfg::WM) * (8 * TN) + lc * 4;  // first input channel of the lane

  // accR, accI, accK hold k1 = sum (gR + gI) fR, k2 = -sum gR (fR + fI), k3 = sum gI (fR - fI); the
  // real part is k1 - k3, the imaginary part k1 + k2 (see the file comment).
  float acc0[TM][TN], acc2[TM][TN], accR[TM][TN], accI[TM][TN], accK[TM][TN];
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    #pragma unroll
    for (int j = 0; j < TN; ++j) acc0[i][j] = acc2[i][j] = accR[i][j] = accI[i][j] = accK[i][j] = 0.f;
  }

  const int KT = int((me - mb + BK - 1) / BK);  // >= 1: the host never makes an empty chunk
  issue_tile(0);
  stage_tile(0);
  __syncthreads();

  for (int kt = 0; kt < KT; ++kt) {
    const bool more = kt + 1 < KT;
    if (more) issue_tile(kt + 1);  // in flight during the FFMAs below

    const float* const A = As + (kt & 1) * Cfg::kAStage + a_off;
    const float* const B = Bs + (kt & 1) * Cfg::kBStage + b_off;
    // Five operand planes per k (0, 2, the three complex combinations), fragments single-buffered:
    // the fifth accumulator set takes the registers that double buffering would need.
    #pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[5][TM], b[5][TN];
      #pragma unroll
      for (int g = 0; g < 5; ++g) {  // the lane's TM output channels (float4s 16 apart), TN inputs (32 apart)
        load_float4s(a[g], A + (g * BK + k) * BD, 16);
        load_float4s(b[g], B + (g * BK + k) * BC, 32);
      }
      outer_fma(acc0, a[0], b[0]);  // acc0 += g0 f0
      outer_fma(accR, a[4], b[1]);  // k1 += (gR + gI) fR
      outer_fma(accI, a[1], b[2]);  // k2 -= gR (fR + fI)
      outer_fma(accK, a[2], b[4]);  // k3 += gI (fR - fI)
      outer_fma(acc2, a[3], b[3]);  // acc2 += g2 f2
    }

    if (more) {
      // The other stage was last read in iteration kt - 1, before the barrier that ended it; the
      // landing slots were last read back before that barrier too.
      stage_tile((kt + 1) & 1);
      __syncthreads();
    }
  }

  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    #pragma unroll
    for (int j = 0; j < TN; ++j) {
      const float k1 = accR[i][j];
      accR[i][j] = k1 - accK[i][j];
      accI[i][j] = k1 + accI[i][j];
    }
  }

  // ---- epilogue: one float4 (4 consecutive input channels) per (plane, output channel, q)
  const float s_real = direct ? 0.5f : 1.f;       // P0, P2
  const float s_cplx = direct ? kInvSqrt2 : 1.f;  // PR, PI
  float* const base = dst + int64_t(blockIdx.z) * 4 * d * ld;
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int o = o0 + a_off + (i / 4) * 16 + i % 4;
    if (o >= d) continue;
    #pragma unroll
    for (int q = 0; q < TN / 4; ++q) {
      const int ci = c0 + b_off + q * 32;
      if (ci >= c) continue;
      #pragma unroll
      for (int g = 0; g < 4; ++g) {
        const float(&acc)[TM][TN] = g == 0 ? acc0 : g == 1 ? accR : g == 2 ? accI : acc2;
        const float sc = (g == 0 || g == 3) ? s_real : s_cplx;
        const float4 v = make_float4(sc * acc[i][4 * q + 0], sc * acc[i][4 * q + 1],
                                     sc * acc[i][4 * q + 2], sc * acc[i][4 * q + 3]);
        float* const p = base + (int64_t(g) * d + o) * ld + ci;
        if (vec_dst) {  // ld % 4 == 0 and ci % 4 == 0, so ci < c implies ci + 3 < ld
          *reinterpret_cast<float4*>(p) = v;
        } else {
          p[0] = v.x;
          if (ci + 1 < c) p[1] = v.y;
          if (ci + 2 < c) p[2] = v.z;
          if (ci + 3 < c) p[3] = v.w;
        }
      }
    }
  }

  // ---- grad_bias: the blocks of the first c-tile column combine the GRS per-thread sums of each
  // output channel in a fixed order (block-uniform condition, so the barrier is safe).
  if (bias_dst != nullptr && blockIdx.y == 0) {
    red[tid] = bsum;
    __syncthreads();
    if (tid < BD && o0 + tid < d) {
      float s = red[tid];
      #pragma unroll
      for (int j = 1; j < GRS; ++j) s += red[tid + j * BD];
      bias_dst[int64_t(blockIdx.z) * d + o0 + tid] = s;
    }
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

using split::cdiv;

// The cost models of the two tiles for the split plan; the big tile does ~1.25x the work per
// SM-cycle of the small one (FFMA issue 128 / SM / cycle times an assumed efficiency); 5 FFMA per
// (row, o, ci): the complex pair as three products.
constexpr split::TileModel kModels[2] = {
    {BigCfg::BD, BigCfg::BC, kBK, BigCfg::kMinBlocks, BigCfg::kThreads, 128.0 * 0.8, 3000.0, false, 5.0},
    {SmallCfg::BD, SmallCfg::BC, kBK, SmallCfg::kMinBlocks, SmallCfg::kThreads, 128.0 * 0.64, 3000.0, false, 5.0},
};

split::Plan make_plan(int64_t M, int64_t c, int64_t d, int sms) {
  return split::make_plan(M, c, d, sms, kModels, 2);
}

bool sizes_ok(int64_t M, int64_t c, int64_t d) {
  // Channel indices are int inside the kernels (o0 + BD, c0 + BC, 4 * d must not overflow), and
  // the k loop counter of a chunk is int.
  return M >= 0 && c >= 1 && d >= 1 && c <= INT_MAX / 4 - 1024 && d <= INT_MAX / 4 - 1024 &&
         M / kBK < INT_MAX;
}

template <class Cfg, bool kVec>
cudaError_t launch_main(const BwdWeightParams& p, const split::Plan& plan, float* dst, float* bias_dst,
                        int ld, bool direct, bool vec_dst, cudaStream_t stream) {
  auto* kernel = eq_linear_bwd_weight_fp32_kernel<Cfg, kVec>;
  if (Cfg::kSmemBytes > 48 * 1024) {
    const cudaError_t err =
        set_max_dynamic_smem(kernel, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const int64_t grid_d = cdiv(p.d, Cfg::BD);
  const int64_t grid_c = cdiv(p.c, Cfg::BC);
  if (grid_d > INT_MAX || grid_c > 65535 || plan.S > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid{unsigned(grid_d), unsigned(grid_c), unsigned(plan.S)};
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      static_cast<const float*>(p.x), static_cast<const float*>(p.gy), dst, bias_dst, p.M,
      int(p.c), int(p.d), plan.chunk_rows, ld, direct, vec_dst);
  return cudaGetLastError();
}

template <class Cfg>
cudaError_t dispatch_vec(const BwdWeightParams& p, const split::Plan& plan, float* dst, float* bias_dst,
                         int ld, bool direct, bool vec_dst, cudaStream_t stream) {
  if (aligned16(p.x) && aligned16(p.gy))
    return launch_main<Cfg, true>(p, plan, dst, bias_dst, ld, direct, vec_dst, stream);
  return launch_main<Cfg, false>(p, plan, dst, bias_dst, ld, direct, vec_dst, stream);
}

}  // namespace

size_t eq_linear_bwd_weight_fp32_workspace_bytes(int64_t M, int64_t c, int64_t d, int sm_count) {
  if (M <= 0 || !sizes_ok(M, c, d)) return 0;
  return split::workspace_bytes(make_plan(M, c, d, sm_count), false, c, d);
}

cudaError_t eq_linear_bwd_weight_fp32(const BwdWeightParams& p, cudaStream_t stream) {
  if (p.gy_parts != 1) return cudaErrorNotSupported;  // (grad_y in parts: the Hopper kernel only)
  if (!sizes_ok(p.M, p.c, p.d)) return cudaErrorInvalidValue;
  if (p.grad_planes == nullptr) return cudaErrorInvalidValue;
  float* const out = static_cast<float*>(p.grad_planes);
  float* const out_bias = static_cast<float*>(p.grad_bias);
  if (p.M == 0) {  // a sum over no rows
    cudaError_t err = cudaMemsetAsync(out, 0, size_t(4 * p.d * p.c) * sizeof(float), stream);
    if (err == cudaSuccess && out_bias != nullptr)
      err = cudaMemsetAsync(out_bias, 0, size_t(p.d) * sizeof(float), stream);
    if (err == cudaSuccess && p.adj != nullptr && p.planes != nullptr)
      err = eq_adjoint_planes(p.planes, p.adj, p.d, p.c, 4, stream);
    return err;
  }
  if (p.x == nullptr || p.gy == nullptr) return cudaErrorInvalidValue;

  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;

  const split::Plan plan = make_plan(p.M, p.c, p.d, sms);
  if (plan.S < 1) return cudaErrorInvalidConfiguration;
  const int c = int(p.c), d = int(p.d);

  float* dst = out;
  float* bias_dst = out_bias;
  int ld = c;
  bool vec_dst = aligned16(out) && c % 4 == 0;
  const bool direct = plan.S == 1;
  float* ws_bias = nullptr;
  if (!direct) {
    const size_t need = split::workspace_bytes(plan, false, p.c, p.d);
    if (p.workspace == nullptr || p.workspace_bytes < need || !aligned16(p.workspace))
      return cudaErrorInvalidValue;
    ld = int(split::round_up4(p.c));
    dst = static_cast<float*>(p.workspace);
    ws_bias = dst + int64_t(plan.S) * 4 * d * ld;
    bias_dst = out_bias != nullptr ? ws_bias : nullptr;
    vec_dst = true;
  }

  err = plan.cfg == 0 ? dispatch_vec<BigCfg>(p, plan, dst, bias_dst, ld, direct, vec_dst, stream)
                      : dispatch_vec<SmallCfg>(p, plan, dst, bias_dst, ld, direct, vec_dst, stream);
  const bool adj = p.planes != nullptr && p.adj != nullptr;
  if (err == cudaSuccess && direct && adj) err = eq_adjoint_planes(p.planes, p.adj, p.d, p.c, 4, stream);
  if (err != cudaSuccess || direct) return err;
  split::AdjointJob job;
  if (adj) job = {p.planes, p.adj};
  return split::launch_reduce<float>(dst, ws_bias, out, out_bias, plan.S, c, d, ld, 0.5f, kInvSqrt2, sms,
                                     stream, 0, job);
}

}  // namespace flash_eqlinear
