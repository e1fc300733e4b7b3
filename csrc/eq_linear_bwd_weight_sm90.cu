// Fused p4 EQ-Linear weight gradient for Hopper (sm_90a): TMA loads, both wgmma operands made in shared
// memory by transform warps, fp16 and bf16 from one template. Math: eq_linear_bwd_weight.h; split over
// rows and reduce: eq_linear_bwd_weight_split.cuh (the launcher in eq_linear_bwd_weight_mma.cu plans,
// allocates and reduces).
//
// GEMM view, as in the mma.sync kernel: block tile 128 output channels o x 64 input channels ci x the
// 4 accumulator sets (P0, PR, PI, P2); the reduction (k) runs over the rows m of the block's chunk in
// k tiles of 32 rows. Per k16 step six wgmma m64n64k16 per consumer warpgroup, both operands from
// shared memory:
//   P0 += g0 f0   PR += gR fR + gI fI   PI += gI fR - gR fI (A scale -1)   P2 += g2 f2
// A (64 o x 16 m per warpgroup) = the transform of grad_y, B (16 m x 64 ci) = the transform of x.
//
// Warp roles (4 warpgroups, one block per SM):
//   warp 0, one thread: the TMA loads of raw grad_y and raw x, 16 rows at a time.
//   warps 1-7: both transforms (FP32, rounded once) in units of 32 channels x 8 rows: 16 units of A and 8
//     of B per k tile, unit u to warp u % 7; then a fence to the async proxy (wgmma reads the stores).
//   warpgroups 2 and 3: the consumers (o rows 0-63, 64-127), which issue the wgmma and store the
//     partials. setmaxnreg: 80 / 176 (80 x 256 + 176 x 256 = the 128 x 512 registers the block starts
//     with).
// The consumers' loop holds no A registers and builds no fragments, so the transforms run ahead of the
// tensor cores by a plane buffer instead of waiting on each wgmma group's registers (the kernel with A
// built in the consumers' registers spent most of each k16 step there: benchmarks/README.md, v23 / v24).
//
// Shared memory (two rings with their own barriers):
//   raw, 4 stages of 16 rows (24 KB): A as 2 boxes of 64 channels ([16 rows][512 B]: 64 channels x 4 group
//     values, no swizzle, so a warp's 8-byte loads of 32 consecutive channels are conflict-free), B as one
//     such box. Loaded by TMA ("raw_full"), released by the transform warps once read ("raw_empty").
//   planes, 2 buffers of 48 KB: A's four planes [g0, gR, gI, g2][128 rows o][64 B], then B's four
//     [f0, fR, fI, f2][64 rows ci][64 B]: wgmma's K-major operand with the 64-byte swizzle (the layout
//     TMA writes for the forward's plane tiles: row r holds the tile's 32 m values, 16-byte chunk q at
//     q ^ ((r >> 1) & 3)). Made by the transform warps ("ready"), released by the consumers once the
//     wgmma groups that read them have retired ("pfree").
//
// Swapped roles (kSwap): x takes grad_y's place as the A operand (tiles of 128 input channels) and grad_y
// takes x's (tiles of 64 output channels); the block computes the transposed tile, stored transposed, with
// PI's sign flipped (gI fR - gR fI = -(fI gR - fR gI)). Same work per block; chosen where it pads the
// output to fewer tile cells (eq_bwd_weight_sm90_swap: e.g. d = 192, c = 768, where the last 128-wide o
// tile would be half empty).
//
// grad_bias: the transform warps sum grad_y's f0 (the four values' sum, halved for fp16) in FP32, per
// unit outside its unrolled body (a branch inside it cost the whole kernel 20-30%: benchmarks/README.md
// v23), over the k tiles kt with kt % (tiles sharing these grad_y rows) == the block's index among them,
// so the chunk's bias work is spread evenly over its blocks; the seven warps' sums are added in warp order
// and each block writes one bias partial (zero where it had no such tile), reduced in a fixed order.
//
// fp16 range: both transforms are halved (as in the mma.sync kernel); the reduce kernel scales.
// Ragged edges: rows past M, channels past c or d arrive as zeros from TMA and add nothing; chunks
// are whole k tiles except the last, which ends at M. Stores are masked. A last A tile of 64 channels or
// fewer leaves consumer warpgroup 3 (rows 64-127) nothing: its raw box, its units and its wgmma are
// skipped.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_linear_bwd_weight_sm90.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_linear_mma_common.cuh"
#include "eq_linear_sm90.cuh"
#include "eq_sm90_host.cuh"

namespace flash_eqlinear {
namespace {

constexpr int kBD = kBwdWeightSm90Model.BD, kBC = kBwdWeightSm90Model.BC, kBK = kBwdWeightSm90Model.BK;
constexpr int kThreads = 512, kXformWarps = 7, kRawStages = 4, kPlaneBufs = 2;
constexpr int kHalfRows = kBK / 2;                                // rows per raw stage
constexpr uint32_t kBox = kHalfRows * 512;                        // 64 channels x 4 group values x 16 rows
constexpr uint32_t kRawBytes = 3 * kBox;                          // A: boxes 0, 1; B: box 2
constexpr uint32_t kAPlane = kBD * 64, kBPlane = kBC * 64;        // 8 KB, 4 KB
constexpr uint32_t kPlaneBufBytes = 4 * kAPlane + 4 * kBPlane;    // 48 KB
constexpr uint32_t kPlanesOff = kRawStages * kRawBytes;           // after the raw ring
constexpr uint32_t kBarOff = kPlanesOff + kPlaneBufs * kPlaneBufBytes;
constexpr uint32_t kBiasOff = kBarOff + 2 * (kRawStages + kPlaneBufs) * 8;  // [7 warps][128 channels]
constexpr int kSmem = kBiasOff + kXformWarps * kBD * 4 + 1024;   // + alignment slack
constexpr int kAUnits = (kBD / 32) * (kBK / 8), kUnits = kAUnits + (kBC / 32) * (kBK / 8);  // 16, 24
static_assert(kBD == 128 && kBC == 64 && kBK == 32, "the layouts above");
static_assert(32 * (1 + kXformWarps) == 256, "warpgroups 0 and 1: the TMA warp and the transform warps");
static_assert(kPlanesOff % 1024 == 0 && kPlaneBufBytes % 1024 == 0, "aligned plane bases");
static_assert(kSmem <= 227 * 1024, "shared memory per block");

// mbarriers: raw rows landed / read (transform warps), planes made / read (consumers).
struct Bars {
  uint32_t raw_full, raw_empty, ready, pfree;
};

struct KParams {
  float* ws;
  float* ws_bias;
  int64_t M, chunk_rows;
  int c, d, ldw;
  int na;  // channels of the A operand (grad_y's d; with kSwap x's c)
};

// Warps 1-7: the planes of A and B for every k tile (header), and the grad_bias partial.
template <class T, bool kSwap>
__device__ __forceinline__ void transform(const KParams& p, uint32_t base, const Bars& bar, int KT,
                                          bool upper_idle) {
  const int tw = (threadIdx.x >> 5) - 1, lane = threadIdx.x & 31;
  const bool bias = p.ws_bias != nullptr;
  // The blocks of a chunk that share its grad_y rows: those of the other operand's tiles.
  const int parts = static_cast<int>(kSwap ? gridDim.x : gridDim.y);
  const int mine = static_cast<int>(kSwap ? blockIdx.x : blockIdx.y);
  float bsum[4] = {0.f, 0.f, 0.f, 0.f};  // grad_y's channels 32 q + lane of the block's grad_y tile
  for (int kt = 0; kt < KT; ++kt) {
    const bool bias_tile = bias && kt % parts == mine;
    const int h0 = 2 * kt, s0 = h0 % kRawStages, s1 = (h0 + 1) % kRawStages, buf = kt % kPlaneBufs;
    mbar_wait(bar.raw_full + 8 * s0, (h0 / kRawStages) & 1);
    mbar_wait(bar.raw_full + 8 * s1, ((h0 + 1) / kRawStages) & 1);
    if (kt >= kPlaneBufs) mbar_wait(bar.pfree + 8 * buf, ((kt / kPlaneBufs) - 1) & 1);  // its last tile was read
    const uint32_t pb = base + kPlanesOff + buf * kPlaneBufBytes;
    // Units tw, tw + 7, ... unrolled, so that one unit's loads can overlap the previous one's math.
#pragma unroll
    for (int k = 0; k < (kUnits + kXformWarps - 1) / kXformWarps; ++k) {
      const int u = tw + kXformWarps * k;
      if (u >= kUnits) break;
      const bool is_a = u < kAUnits;
      const int cb = is_a ? (u & 3) : (u & 1);                   // 32-channel block of the operand tile
      const int mg = is_a ? (u >> 2) : ((u - kAUnits) >> 1);     // 8-row group of the k tile
      if (is_a && cb >= 2 && upper_idle) continue;
      const int r = 32 * cb + lane;                              // plane row: channel of the operand tile
      const uint32_t xr = base + (mg < 2 ? s0 : s1) * kRawBytes + (is_a ? (cb >> 1) : 2) * kBox +
                          (mg & 1) * 8 * 512 + (32 * (cb & 1) + lane) * 8;
      const uint32_t plane = is_a ? kAPlane : kBPlane;
      const uint32_t dst = pb + (is_a ? 0u : 4 * kAPlane) + r * 64 + ((mg ^ ((r >> 1) & 3)) << 4);
      uint32_t packed[4][4];  // [plane][row pair]
      float usum = 0.f;       // f0 over the unit's rows (grad_y's units: grad_bias)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float f[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint2 v = lds64(xr + (2 * i + h) * 512);
          const float2 a = Elem<T>::unpack(v.x), b = Elem<T>::unpack(v.y);
          dft4<Elem<T>::kHalve>(a.x, a.y, b.x, b.y, f[h][0], f[h][1], f[h][2], f[h][3]);
        }
        usum += f[0][0] + f[1][0];  // unconditional: no branch in the unrolled body
#pragma unroll
        for (int pl = 0; pl < 4; ++pl) packed[pl][i] = Elem<T>::pack(f[0][pl], f[1][pl]);
      }
#pragma unroll
      for (int pl = 0; pl < 4; ++pl) sts128(dst + pl * plane, packed[pl]);
      if (bias_tile && is_a != kSwap) {  // grad_y's unit (no register array indexed at run time)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (cb == q) bsum[q] += usum;
      }
    }
    fence_proxy_async_smem();  // the stores are read by wgmma (the async proxy)
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(bar.raw_empty + 8 * s0);
      mbar_arrive(bar.raw_empty + 8 * s1);
      mbar_arrive(bar.ready + 8 * buf);
    }
  }
  if (bias) {  // the seven warps' sums of each channel, added in warp order
    const uint32_t red = base + kBiasOff;  // [warp][channel of the grad_y tile]
#pragma unroll
    for (int q = 0; q < 4; ++q) sts32(red + 4 * (tw * kBD + 32 * q + lane), __float_as_uint(bsum[q]));
    named_barrier_sync(1, 32 * kXformWarps);
    if (tw == 0) {
      const int n = kSwap ? kBC : kBD;  // grad_y's tile: B (64 o) with kSwap, else A (128 o)
      const int o0 = static_cast<int>(kSwap ? blockIdx.y : blockIdx.x) * n;
      float* const wb = p.ws_bias + (int64_t(blockIdx.z) * parts + mine) * p.d;
      for (int ch = lane; ch < n; ch += 32) {
        float sum = __uint_as_float(lds32(red + 4 * ch));
        for (int w = 1; w < kXformWarps; ++w) sum += __uint_as_float(lds32(red + 4 * (w * kBD + ch)));
        if (o0 + ch < p.d) wb[o0 + ch] = Elem<T>::kHalve ? 2.f * sum : sum;  // fp16's f0 is halved
      }
    }
  }
}

// The consumer warpgroups (warps 8-15).
template <class T, bool kSwap>
__device__ __forceinline__ void consume(const KParams& p, uint32_t base, const Bars& bar, int KT) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, t = lane & 3;
  const int cw = warp - 8;  // consumer warp: o rows 16 cw .. 16 cw + 15 of the tile
  // Plane buffer 0, k16 step 0: A's g0 at this warpgroup's 64 rows, B's f0
  const uint64_t da0 = wgmma_desc_sw64(base + kPlanesOff + (cw >> 2) * 64 * 64);
  const uint64_t db0 = wgmma_desc_sw64(base + kPlanesOff + 4 * kAPlane);

  float acc[4][8][4];  // sets: 0 = P0, 1 = PR, 2 = PI, 3 = P2; [n8 block][C fragment]
  zero_acc(acc);
  for (int kt = 0; kt < KT; ++kt) {
    const int buf = kt % kPlaneBufs;
    mbar_wait(bar.ready + 8 * buf, (kt / kPlaneBufs) & 1);
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const uint32_t step = (buf * kPlaneBufBytes + ks * 32) >> 4;  // descriptor address units
      const uint64_t a0 = da0 + step, ar = a0 + (kAPlane >> 4), ai = a0 + (2 * kAPlane >> 4),
                     a2 = a0 + (3 * kAPlane >> 4);
      const uint64_t b0 = db0 + step, br = b0 + (kBPlane >> 4), bi = b0 + (2 * kBPlane >> 4),
                     b2 = b0 + (3 * kBPlane >> 4);
      wgmma_fence();
      wgmma_m64n64_ss<T, 1>(acc[1], ar, br);
      wgmma_m64n64_ss<T, 1>(acc[2], ai, br);
      wgmma_m64n64_ss<T, 1>(acc[0], a0, b0);
      wgmma_m64n64_ss<T, 1>(acc[3], a2, b2);
      wgmma_m64n64_ss<T, 1>(acc[1], ai, bi);
      wgmma_m64n64_ss<T, -1>(acc[2], ar, bi);  // with kSwap: -PI (header), negated in the store
      wgmma_commit();
      wgmma_wait<1>();  // the previous step's group has retired
      // At ks == 0 that previous group was k tile kt - 1's last: release its buffer.
      if (ks == 0 && kt > 0 && lane == 0) mbar_arrive(bar.pfree + 8 * ((kt - 1) % kPlaneBufs));
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int s = 0; s < 4; ++s) reg_fence(acc[s]);

  // ---- FP32 partials. Fragment rows gid and gid + 8 are the tile's rows 16 cw + gid (+ 8); columns 2t, 2t + 1 of
  // each n8 block.
  const int c = p.c, d = p.d;
  const int r_lo = static_cast<int>(blockIdx.x) * kBD + 16 * cw + gid;  // A channel of fragment row gid
  const int c0 = static_cast<int>(blockIdx.y) * kBC;
  float* const ws = p.ws + int64_t(blockIdx.z) * 4 * d * p.ldw;
  if constexpr (kSwap) {  // rows: input channels r_lo, r_lo + 8; columns: o, o + 1 (one float each)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int ci = r_lo + 8 * h;
      if (ci >= c) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int o = c0 + 8 * j + 2 * t + i;
          if (o >= d) continue;
#pragma unroll
          for (int pl = 0; pl < 4; ++pl)
            ws[(int64_t(pl) * d + o) * p.ldw + ci] = pl == 2 ? -acc[pl][j][2 * h + i] : acc[pl][j][2 * h + i];
        }
      }
    }
  } else {
    // rows: output channels r_lo, r_lo + 8; one float2 (ci, ci + 1) per (set, o): ldw % 4 == 0 and ci even,
    // so ci < c implies ci + 1 < ldw.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int ci = c0 + 8 * j + 2 * t;
      if (ci >= c) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int o = r_lo + 8 * h;
        if (o >= d) continue;
#pragma unroll
        for (int pl = 0; pl < 4; ++pl)
          *reinterpret_cast<float2*>(ws + (int64_t(pl) * d + o) * p.ldw + ci) =
              make_float2(acc[pl][j][2 * h], acc[pl][j][2 * h + 1]);
      }
    }
  }
}

// tm_a / tm_b: the A / B operands' maps (grad_y / x; with kSwap x / grad_y), boxes of 64 channels x 16 rows.
template <class T, bool kSwap>
__global__ void __launch_bounds__(kThreads, 1)
eq_bwd_weight_sm90_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                          const KParams p) {
#ifdef FLASH_EQLINEAR_WGMMA
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  Bars bar;
  bar.raw_full = base + kBarOff;
  bar.raw_empty = bar.raw_full + 8 * kRawStages;
  bar.ready = bar.raw_empty + 8 * kRawStages;
  bar.pfree = bar.ready + 8 * kPlaneBufs;
  const int64_t mb = int64_t(blockIdx.z) * p.chunk_rows;  // this block's rows: [mb, me)
  const int64_t me = std::min(p.M, mb + p.chunk_rows);
  const int KT = static_cast<int>((me - mb + kBK - 1) / kBK);  // >= 1: the plan makes no empty chunk
  // A last A tile of 64 channels or fewer (d % 128 in 1 .. 64: ViT-B's d = 192, 576) leaves consumer
  // warpgroup 3 (rows 64-127) nothing: it idles, and its raw box and units are skipped.
  const bool upper_idle = static_cast<int>(blockIdx.x) * kBD + 64 >= p.na;
  const int consumer_warps = upper_idle ? 4 : 8;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kRawStages; ++s) {
      mbar_init(bar.raw_full + 8 * s, 1);
      mbar_init(bar.raw_empty + 8 * s, kXformWarps);
    }
    for (int b = 0; b < kPlaneBufs; ++b) {
      mbar_init(bar.ready + 8 * b, kXformWarps);
      mbar_init(bar.pfree + 8 * b, consumer_warps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (threadIdx.x < 256) {  // ---- warpgroups 0 and 1: TMA and the transforms ----
    setmaxnreg_dec<80>();
    if (threadIdx.x == 0) {
      tma_prefetch_desc(&tm_a);
      tma_prefetch_desc(&tm_b);
      const int a0 = static_cast<int>(blockIdx.x) * kBD, b0 = static_cast<int>(blockIdx.y) * kBC;
      const uint32_t bytes = (upper_idle ? 2 : 3) * kBox;
      for (int h = 0; h < 2 * KT; ++h) {
        const int row = static_cast<int>(mb) + h * kHalfRows;  // < 2^31: the host bounds M
        const int s = h % kRawStages;
        const uint32_t dst = base + s * kRawBytes;
        if (h >= kRawStages) mbar_wait(bar.raw_empty + 8 * s, ((h / kRawStages) - 1) & 1);
        mbar_arrive_expect_tx(bar.raw_full + 8 * s, bytes);
        tma_load_2d(dst, &tm_a, a0 * 4, row, bar.raw_full + 8 * s);
        if (!upper_idle) tma_load_2d(dst + kBox, &tm_a, (a0 + 64) * 4, row, bar.raw_full + 8 * s);
        tma_load_2d(dst + 2 * kBox, &tm_b, b0 * 4, row, bar.raw_full + 8 * s);
      }
    } else if (threadIdx.x >= 32) {
      transform<T, kSwap>(p, base, bar, KT, upper_idle);
    }
  } else {
    setmaxnreg_inc<176>();
    if (threadIdx.x < 384 || !upper_idle) consume<T, kSwap>(p, base, bar, KT);
  }
#else
  (void)tm_a, (void)tm_b, (void)p;
  __trap();
#endif
}

template <class T, bool kSwap>
cudaError_t launch(const BwdWeightSm90Args& a, cudaStream_t stream) {
  constexpr int kE = sizeof(T);
  // The A operand (tiles of kBD channels) and the B operand (tiles of kBC channels)
  const void* const pa = kSwap ? a.x : a.gy;
  const void* const pb = kSwap ? a.gy : a.x;
  const int64_t na = kSwap ? a.c : a.d, nb = kSwap ? a.d : a.c;
  CUtensorMap tm_a, tm_b;
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(4 * na), static_cast<cuuint64_t>(a.M)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(4 * kE) * na};
  const cuuint32_t a_box[2] = {4 * 64, kHalfRows};  // 64 channels x 4 group values: 512 bytes
  const cuuint64_t b_dims[2] = {static_cast<cuuint64_t>(4 * nb), static_cast<cuuint64_t>(a.M)};
  const cuuint64_t b_strides[1] = {static_cast<cuuint64_t>(4 * kE) * nb};
  const cuuint32_t b_box[2] = {4 * 64, kHalfRows};
  if (!encode(&tm_a, pa, kE, 2, a_dims, a_strides, a_box, CU_TENSOR_MAP_SWIZZLE_NONE) ||
      !encode(&tm_b, pb, kE, 2, b_dims, b_strides, b_box, CU_TENSOR_MAP_SWIZZLE_NONE))
    return cudaErrorInvalidValue;
  KParams kp{a.ws, a.ws_bias, a.M, a.chunk_rows, a.c, a.d, a.ldw, static_cast<int>(na)};
  auto kernel = eq_bwd_weight_sm90_kernel<T, kSwap>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const int64_t grid_a = (na + kBD - 1) / kBD, grid_b = (nb + kBC - 1) / kBC;
  if (grid_a > 0x7fffffff || grid_b > 65535 || a.S < 1 || a.S > 65535) return cudaErrorInvalidConfiguration;
  kernel<<<dim3(unsigned(grid_a), unsigned(grid_b), unsigned(a.S)), kThreads, kSmem, stream>>>(tm_a, tm_b, kp);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch(const BwdWeightSm90Args& a, cudaStream_t stream) {
  return a.swap ? launch<T, true>(a, stream) : launch<T, false>(a, stream);
}

}  // namespace

bool eq_bwd_weight_sm90_eligible(int64_t M, int64_t c, int64_t d, int dev) {
  if (!sm90_path_enabled() || M <= 0 || M > 0x7fffffff - 2 * kBK || c % 2 != 0 || d % 2 != 0 || c > (1 << 28) ||
      d > (1 << 28) || encoder() == nullptr)
    return false;
  int major = 0, smem_optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  static int8_t known[64] = {};
  return major == 9 && smem_optin >= kSmem &&
         kernel_runs_sm90a(eq_bwd_weight_sm90_kernel<__half, false>, dev, known);
}

bool eq_bwd_weight_sm90_swap(int64_t c, int64_t d) {
  const char* v = std::getenv("FLASH_EQLINEAR_WGRAD_SWAP");
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  if (v != nullptr && std::strcmp(v, "1") == 0) return true;
  const auto padded = [](int64_t n, int64_t tile) { return (n + tile - 1) / tile * tile; };
  return padded(c, kBD) * padded(d, kBC) < padded(d, kBD) * padded(c, kBC);
}

cudaError_t eq_bwd_weight_sm90_fp16(const BwdWeightSm90Args& args, cudaStream_t stream) {
  return launch<__half>(args, stream);
}

cudaError_t eq_bwd_weight_sm90_bf16(const BwdWeightSm90Args& args, cudaStream_t stream) {
  return launch<__nv_bfloat16>(args, stream);
}

}  // namespace flash_eqlinear
