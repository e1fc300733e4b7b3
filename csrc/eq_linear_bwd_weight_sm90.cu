// Fused p4 EQ-Linear weight gradient for Hopper (sm_90a): TMA loads, register-A wgmma, fp16 and bf16
// from one template. Math: eq_linear_bwd_weight.h; split over rows and reduce:
// eq_linear_bwd_weight_split.cuh (the launcher in eq_linear_bwd_weight_mma.cu plans, allocates and
// reduces).
//
// GEMM view, as in the mma.sync kernel: block tile 128 output channels o x 64 input channels ci x the
// 4 accumulator sets (P0, PR, PI, P2); the reduction (k) runs over the rows m of the block's chunk in
// k tiles of 32 rows. Per k16 step six wgmma m64n64k16 per consumer warpgroup:
//   P0 += g0 f0   PR += gR fR + gI fI   PI += gI fR - gR fI (A scale -1)   P2 += g2 f2
// A (64 o x 16 m per warpgroup) = the transform of grad_y, built in registers from its raw values;
// B (16 m x 64 ci) = the transform of x, made in shared memory by producer warps.
// Grid: one block per (A tile, B tile, row chunk), 1-D (tile_of). A last A tile of 64 channels or fewer (d %
// 128 in 1 .. 64, e.g. ViT-B's d = 192, 576: half the MACs of a full tile) may take fewer, longer row chunks
// than the others (BwdWeightSm90Args::S_last), so that all blocks finish together in one wave of the GPU.
//
// Warp roles (3 warpgroups, one block per SM) and shared memory (224 KB), three rings with their own
// barriers, so that each buffer is held only while it is needed:
//   raw grad_y, 4 stages of 32 KB ([8 boxes of 16 o][32 rows][128 B], 128-byte swizzle): loaded by TMA
//     ("gy_full"), released by the consumers as soon as a tile's values are in registers ("gy_empty").
//   raw x, 3 stages of 16 KB ([32 rows][512 B]: 64 channels x 4 group values, no swizzle, so a warp's
//     8-byte loads of 32 consecutive channels are conflict-free): loaded by TMA ("x_full"), released by
//     the transform warps once read ("x_empty").
//   x's planes, 3 buffers of 16 KB ([f0, fR, fI, f2][64 rows ci][64 B]: wgmma's K-major B operand with
//     the 64-byte swizzle, the layout TMA writes for the forward's plane tiles: row ci holds the tile's
//     32 m values, 16-byte chunk q at q ^ ((ci >> 1) & 3)): made by the transform warps ("ready"),
//     released by the consumers once the wgmma groups that read them have retired ("pfree").
//   warp 0, one thread: the TMA loads, tile by tile.
//   warps 1-3: x's transform (FP32, rounded once), then a fence to the async proxy (wgmma reads the
//     stores) before "ready".
//   warpgroups 1 and 2: the consumers (o rows 0-63, 64-127). setmaxnreg: 56 / 224 (56 x 128 + 224 x 256
//     = the 168 x 384 registers the block starts with).
// Separate rings measured faster at the layers this kernel takes than one 3-stage ring of all
// three (docs/kernels.md, Hopper weight gradient).
//
// Swapped roles (kSwap): x takes grad_y's place as the A operand (its transform in registers, tiles of
// 128 input channels) and grad_y takes x's (transformed in shared memory, tiles of 64 output channels);
// the block computes the transposed tile, stored transposed, with PI's sign flipped (gI fR - gR fI =
// -(fI gR - fR gI)), and the transform warps sum grad_bias (grad_y's f0, summed per unit outside the
// unrolled transform body: a branch inside it slowed the whole kernel, as the transform warps share
// schedulers with the consumers, which set the pace). Same work per block; chosen where it pads the
// output to fewer tile cells (eq_bwd_weight_sm90_swap: e.g. d = 192, c = 768, where the last 128-wide
// o tile would be half empty). Measurements: docs/kernels.md, Hopper weight gradient.
//
// A fragments: a fragment row holds one o, a register pair two consecutive m. Fragment rows gid and
// gid + 8 of a warp are its o pair (2 gid, 2 gid + 1), so that one LDS.128 of raw grad_y (the 4 group
// values of both, at one m) feeds both; a thread loads rows m = 2t, 2t + 1, 2t + 8, 2t + 9 of the k16
// step (4 LDS.128) and transforms them in FP32 (rounded once, as in the mma.sync kernel). Raw
// grad_y lands as 8 boxes of 16 o (128 bytes per row) with the 128-byte swizzle, one per consumer warp;
// a quarter-warp's 8 chunks then fall in 8 distinct bank groups. Raw grad_y is loaded two k16 steps
// ahead and the A registers are double buffered, as in the forward kernel (eq_linear_fwd_sm90.cu).
//
// grad_bias: the consumers sum the raw grad_y values of their fragment positions in FP32 over the k
// tiles kt with kt % (c tiles) == the block's c tile, so the chunk's bias work is spread evenly over its
// blocks; each writes one bias partial (zero where it had no such tile), reduced in a fixed order.
//
// grad_y in parts (BwdWeightSm90Args::gy_parts: column blocks in tensors of their own, e.g. the gradients of an
// attention's q, k, v): one tensor map per part; the TMA thread picks each box's (a part holds whole boxes).
//
// fp16 range: both transforms are halved (as in the mma.sync kernel); the reduce kernel scales.
// Ragged edges: rows past M, channels past c or d arrive as zeros from TMA and add nothing; chunks
// are whole k tiles except the last, which ends at M. Stores are masked.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_func_attr.cuh"
#include "eq_linear_bwd_weight_sm90.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_linear_mma_common.cuh"
#include "eq_linear_sm90.cuh"
#include "eq_pdl.cuh"
#include "eq_sm90_host.cuh"
#include "eq_switches.h"

namespace flash_eqlinear {
namespace {

constexpr int kBD = kBwdWeightSm90Model.BD, kBC = kBwdWeightSm90Model.BC, kBK = kBwdWeightSm90Model.BK;
constexpr int kGyStages = 4, kXStages = 3, kPlaneBufs = 3, kThreads = 384, kXformWarps = 3;
constexpr uint32_t kGyBox = kBK * 128;                            // 16 o x 4 group values x 32 rows
constexpr uint32_t kGyBytes = (kBD / 16) * kGyBox;                // 32 KB
constexpr uint32_t kXBytes = kBK * kBC * 4 * 2;                   // 16 KB
constexpr uint32_t kPlane = kBC * kBK * 2;                        // 4 KB
constexpr uint32_t kXOff = kGyStages * kGyBytes;                  // the raw x ring
constexpr uint32_t kPlanesOff = kXOff + kXStages * kXBytes;         // x's four planes, kPlaneBufs buffers
constexpr uint32_t kBarOff = kPlanesOff + kPlaneBufs * 4 * kPlane;  // the mbarriers
constexpr uint32_t kBiasOff = kBarOff + 2 * (kGyStages + kXStages + kPlaneBufs) * 8;  // kSwap: [3 warps][64]
constexpr int kSmem = kBiasOff + kXformWarps * kBC * 4 + 1024;  // + alignment slack
static_assert(kBD == 128 && kBC == 64 && kBK == 32, "the layouts above");
static_assert(32 * (1 + kXformWarps) == 128, "the producer warpgroup: the TMA warp and the transform warps");
static_assert(kGyBytes % 1024 == 0 && kXOff % 1024 == 0 && kPlanesOff % 1024 == 0, "aligned bases");

// mbarriers: raw grad_y landed / read (consumers), raw x landed / read (transform warps), x's planes
// made / read (consumers).
struct Bars {
  uint32_t gy_full, gy_empty, x_full, x_empty, ready, pfree;
};

struct KParams {
  float* ws;
  float* ws_bias;
  int64_t M, chunk_rows, chunk_rows_last;
  int c, d, ldw;
  int na;        // channels of the A operand (grad_y's d; with kSwap x's c)
  int ga, gb;    // A tiles, B tiles
  int S, S_last; // row chunks of the A tiles but the last, of the last (BwdWeightSm90Args)
  int g_part;    // grad_y's channels per part (BwdWeightSm90Args::gy_parts; 2^29 with one part)
};

// A block's tile and rows. The grid is 1-D: (ga - 1) * gb * S blocks for the A tiles but the last (A tile
// fastest, then B tile, then chunk), then gb * S_last for the last A tile.
struct Tile {
  int a, b, z;
  int64_t mb, me;  // rows [mb, me)
};

[[maybe_unused]] __device__ __forceinline__ Tile tile_of(const KParams& p) {  // (unused in the sm_80 pass)
  const int L = static_cast<int>(blockIdx.x), full = (p.ga - 1) * p.gb * p.S;
  Tile t;
  int64_t chunk = p.chunk_rows;
  if (L < full) {
    t.a = L % (p.ga - 1);
    t.b = (L / (p.ga - 1)) % p.gb;
    t.z = L / ((p.ga - 1) * p.gb);
  } else {
    t.a = p.ga - 1;
    t.b = (L - full) % p.gb;
    t.z = (L - full) / p.gb;
    chunk = p.chunk_rows_last;
  }
  t.mb = int64_t(t.z) * chunk;
  t.me = std::min(p.M, t.mb + chunk);
  return t;
}

// Producer warps 1-3: the B operand's four planes of every k tile (header). With kSwap (B = grad_y) they
// also sum grad_bias over the k tiles kt with kt % (A tiles) == the block's A tile (the blocks of a chunk that
// share these rows split the work), in FP32, and write the block's partial.
template <class T, bool kSwap>
__device__ __forceinline__ void transform_x(const KParams& p, const Tile& tile, uint32_t base, const Bars& bar,
                                            int KT) {
  const int wt = (threadIdx.x >> 5) - 1, lane = threadIdx.x & 31;
  const bool bias = kSwap && p.ws_bias != nullptr;
  float bsum[2] = {0.f, 0.f};  // channels lane, 32 + lane of the B tile
  for (int kt = 0; kt < KT; ++kt) {
    const bool bias_tile = bias && kt % p.ga == tile.a;
    const int s = kt % kXStages, buf = kt % kPlaneBufs;
    mbar_wait(bar.x_full + 8 * s, (kt / kXStages) & 1);
    if (kt >= kPlaneBufs) mbar_wait(bar.pfree + 8 * buf, ((kt / kPlaneBufs) - 1) & 1);  // its last tile was read
    const uint32_t xr = base + kXOff + s * kXBytes, pb = base + kPlanesOff + buf * 4 * kPlane;
    // Unit u: 32 channels x 8 rows; units wt, wt + 3, wt + 6 (< 8) unrolled, so that one unit's loads can
    // overlap the previous one's math (56 registers; no slower at ViT sizes: docs/kernels.md, Hopper weight gradient).
#pragma unroll
    for (int k = 0; k < (8 + kXformWarps - 1) / kXformWarps; ++k) {
      const int u = wt + kXformWarps * k;
      if (u >= 8) break;
      const int ci = 32 * (u & 1) + lane, mg = u >> 1;
      uint32_t packed[4][4];  // [plane][row pair]
      float usum = 0.f;       // kSwap: f0 (the four values' sum, halved for fp16) over the unit's rows
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float f[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint2 v = lds64(xr + (8 * mg + 2 * i + h) * 512 + ci * 8);
          const float2 a = Elem<T>::unpack(v.x), b = Elem<T>::unpack(v.y);
          dft4<Elem<T>::kHalve>(a.x, a.y, b.x, b.y, f[h][0], f[h][1], f[h][2], f[h][3]);
        }
        if constexpr (kSwap) usum += f[0][0] + f[1][0];  // unconditional: no branch in the unrolled body
#pragma unroll
        for (int pl = 0; pl < 4; ++pl) packed[pl][i] = Elem<T>::pack(f[0][pl], f[1][pl]);
      }
      const uint32_t off = ci * 64 + ((mg ^ ((ci >> 1) & 3)) << 4);
#pragma unroll
      for (int pl = 0; pl < 4; ++pl) sts128(pb + pl * kPlane + off, packed[pl]);
      if (bias_tile) {  // (no register array indexed at run time: that would go to local memory)
        if (u & 1)
          bsum[1] += usum;
        else
          bsum[0] += usum;
      }
    }
    fence_proxy_async_smem();  // the stores are read by wgmma (the async proxy)
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(bar.x_empty + 8 * s);
      mbar_arrive(bar.ready + 8 * buf);
    }
  }
  if (bias) {  // the three warps' sums of each channel, added in warp order
    const uint32_t red = base + kBiasOff;  // [warp][channel of the B tile]
    sts32(red + 4 * (wt * kBC + lane), __float_as_uint(bsum[0]));
    sts32(red + 4 * (wt * kBC + 32 + lane), __float_as_uint(bsum[1]));
    named_barrier_sync(1, 32 * kXformWarps);
    if (wt == 0) {
      const int o0 = tile.b * kBC;
      float* const wb = p.ws_bias + (int64_t(tile.z) * p.ga + tile.a) * p.d;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int ch = 32 * h + lane;
        const float s0 = __uint_as_float(lds32(red + 4 * ch)), s1 = __uint_as_float(lds32(red + 4 * (kBC + ch)));
        const float sum = (s0 + s1) + __uint_as_float(lds32(red + 4 * (2 * kBC + ch)));
        if (o0 + ch < p.d) wb[o0 + ch] = Elem<T>::kHalve ? 2.f * sum : sum;  // fp16's f0 is halved
      }
    }
  }
}

// The consumer warpgroups (warps 4-11).
template <class T, bool kSwap>
__device__ __forceinline__ void consume(const KParams& p, const Tile& tile, uint32_t base, const Bars& bar, int KT) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, t = lane & 3;
  const int cw = warp - 4;  // consumer warp: o rows 16 cw .. 16 cw + 15 of the tile = gy box cw
  // Rows 2t, 2t + 1 (+ 8) of a k16 step: chunk gid swizzled by m & 7 = 2t, resp. 2t + 1
  const uint32_t a_lo = cw * kGyBox + 2 * t * 128 + ((gid ^ (2 * t)) << 4);
  const uint32_t a_hi = cw * kGyBox + (2 * t + 1) * 128 + ((gid ^ (2 * t + 1)) << 4);
  const uint64_t desc0 = wgmma_desc_sw64(base + kPlanesOff);  // plane buffer 0, plane f0, k16 step 0
  const bool bias = !kSwap && p.ws_bias != nullptr;  // with kSwap the transform warps sum grad_bias
  const int num_c = p.gb, my_c = tile.b;

  float acc[4][8][4];  // sets: 0 = P0, 1 = PR, 2 = PI, 3 = P2; [n8 block][C fragment]
  zero_acc(acc);
  float bsum[2] = {0.f, 0.f};  // raw grad_y of o = 2 gid, 2 gid + 1 (this thread's rows)

  uint32_t fa[2][4][4] = {};  // [buffer = k16 step parity][g0, gR, gI, g2][A fragment register]
  // Raw grad_y of k16 step ks: rows 16 ks + (2t, 2t + 1, 2t + 8, 2t + 9), loaded two steps ahead.
  uint4 v[2][4];
  auto load = [&](uint4(&w)[4], uint32_t st, int ks) {
    w[0] = lds128(st + a_lo + ks * 16 * 128);
    w[1] = lds128(st + a_hi + ks * 16 * 128);
    w[2] = lds128(st + a_lo + (ks * 16 + 8) * 128);
    w[3] = lds128(st + a_hi + (ks * 16 + 8) * 128);
  };
  mbar_wait(bar.gy_full, 0);
  load(v[0], base, 0);
  load(v[1], base, 1);
  for (int kt = 0; kt < KT; ++kt) {
    const bool bias_tile = bias && kt % num_c == my_c;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t(&f)[4][4] = fa[ks];
      const uint4(&w)[4] = v[ks];
      // register r: o lo / hi (r & 1), rows 2t, 2t + 1 (+ 8 for r >> 1): m pairs from two chunks
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint4& c0 = w[2 * (r >> 1)];      // row 2t (+ 8)
        const uint4& c1 = w[2 * (r >> 1) + 1];  // row 2t + 1 (+ 8)
        const uint32_t lo = (r & 1) ? c0.z : c0.x, hi = (r & 1) ? c0.w : c0.y;
        const uint32_t lo1 = (r & 1) ? c1.z : c1.x, hi1 = (r & 1) ? c1.w : c1.y;
        const float2 a = Elem<T>::unpack(lo), b = Elem<T>::unpack(hi);    // g0..g3 at row m
        const float2 e = Elem<T>::unpack(lo1), g = Elem<T>::unpack(hi1);  // at row m + 1
        float p0[4], p1[4];
        dft4<Elem<T>::kHalve>(a.x, a.y, b.x, b.y, p0[0], p0[1], p0[2], p0[3]);
        dft4<Elem<T>::kHalve>(e.x, e.y, g.x, g.y, p1[0], p1[1], p1[2], p1[3]);
#pragma unroll
        for (int pl = 0; pl < 4; ++pl) f[pl][r] = Elem<T>::pack(p0[pl], p1[pl]);
        if (bias_tile) bsum[r & 1] += ((a.x + a.y) + (b.x + b.y)) + ((e.x + e.y) + (g.x + g.y));
      }
      if (ks == 1) {  // tile kt's raw grad_y is in registers now: its stage is free
        __syncwarp();
        if (lane == 0) mbar_arrive(bar.gy_empty + 8 * (kt % kGyStages));
      }
      if (ks == 0) mbar_wait(bar.ready + 8 * (kt % kPlaneBufs), (kt / kPlaneBufs) & 1);  // x's planes of this tile
      const uint64_t dk = desc0 + (((kt % kPlaneBufs) * 4 * kPlane + ks * 32) >> 4);
      const uint64_t d0 = dk, dr = dk + (kPlane >> 4), di = dk + (2 * kPlane >> 4), d2 = dk + (3 * kPlane >> 4);
      wgmma_fence();
      wgmma_m64n64_rs<T, 1>(acc[1], f[1], dr);
      wgmma_m64n64_rs<T, 1>(acc[2], f[2], dr);
      wgmma_m64n64_rs<T, 1>(acc[0], f[0], d0);
      wgmma_m64n64_rs<T, 1>(acc[3], f[3], d2);
      wgmma_m64n64_rs<T, 1>(acc[1], f[2], di);
      wgmma_m64n64_rs<T, -1>(acc[2], f[1], di);  // with kSwap: -PI (header), negated in the store
      wgmma_commit();
      if (kt + 1 < KT) {  // v[ks] is in f now: load this step's rows of the next k tile
        const int next = (kt + 1) % kGyStages;
        if (ks == 0) mbar_wait(bar.gy_full + 8 * next, ((kt + 1) / kGyStages) & 1);
        load(v[ks], base + next * kGyBytes, ks);
      }
      wgmma_wait<1>();  // the previous step's group has retired: its A buffer (and stage) are free
#pragma unroll
      for (int op = 0; op < 4; ++op) reg_fence(fa[ks ^ 1][op]);
      // At ks == 0 that previous group was k tile kt - 1's last: release its stage.
      if (ks == 0 && kt > 0 && lane == 0) mbar_arrive(bar.pfree + 8 * ((kt - 1) % kPlaneBufs));
    }
  }
  wgmma_retire_all(acc, fa);

  // ---- FP32 partials: one float2 (ci, ci + 1) per (set, o); ldw % 4 == 0 and ci even, so ci < c
  // implies ci + 1 < ldw.
  const int c = p.c, d = p.d;
  const int r_lo = tile.a * kBD + 16 * cw + 2 * gid;  // channel of fragment row gid; gid + 8: r_lo + 1
  const int c0 = my_c * kBC;
  float* const ws = p.ws + int64_t(tile.z) * 4 * d * p.ldw;
  if constexpr (kSwap) {  // rows: input channels r_lo, r_lo + 1 (one float2); columns: o, o + 1
    if (r_lo >= c) return;  // c even: r_lo + 1 < c too
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int o = c0 + 8 * j + 2 * t + i;
        if (o >= d) continue;
#pragma unroll
        for (int pl = 0; pl < 4; ++pl) {
          const float sg = pl == 2 ? -1.f : 1.f;
          *reinterpret_cast<float2*>(ws + (int64_t(pl) * d + o) * p.ldw + r_lo) =
              make_float2(sg * acc[pl][j][i], sg * acc[pl][j][2 + i]);
        }
      }
    }
    return;
  }
  const int o_lo = r_lo;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int ci = c0 + 8 * j + 2 * t;
    if (ci >= c) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int o = o_lo + h;
      if (o >= d) continue;
#pragma unroll
      for (int pl = 0; pl < 4; ++pl)
        *reinterpret_cast<float2*>(ws + (int64_t(pl) * d + o) * p.ldw + ci) =
            make_float2(acc[pl][j][2 * h], acc[pl][j][2 * h + 1]);
    }
  }
  if (bias) {  // the 4 lanes of a gid hold the rows 2t.. of the same o pair: add them in a fixed order
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bsum[h] += __shfl_xor_sync(0xffffffffu, bsum[h], 1);
      bsum[h] += __shfl_xor_sync(0xffffffffu, bsum[h], 2);
    }
    float* const wb = p.ws_bias + (int64_t(tile.z) * num_c + my_c) * d;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (t == 0 && o_lo + h < d) wb[o_lo + h] = bsum[h];
  }
}

// tm_gy / tm_x: the A / B operands' maps (grad_y / x; with kSwap x / grad_y); tm_g1 / tm_g2: grad_y's
// parts 1 and 2 (BwdWeightSm90Args::gy_parts; that map is part 0).
template <class T, bool kSwap>
__global__ void __launch_bounds__(kThreads, 1)
eq_bwd_weight_sm90_kernel(const __grid_constant__ CUtensorMap tm_gy, const __grid_constant__ CUtensorMap tm_x,
                          const __grid_constant__ CUtensorMap tm_g1, const __grid_constant__ CUtensorMap tm_g2,
                          const KParams p) {
#ifdef FLASH_EQLINEAR_WGMMA
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  Bars bar;
  bar.gy_full = base + kBarOff;
  bar.gy_empty = bar.gy_full + 8 * kGyStages;
  bar.x_full = bar.gy_empty + 8 * kGyStages;
  bar.x_empty = bar.x_full + 8 * kXStages;
  bar.ready = bar.x_empty + 8 * kXStages;
  bar.pfree = bar.ready + 8 * kPlaneBufs;
  const Tile tile = tile_of(p);
  const int64_t mb = tile.mb, me = tile.me;                    // this block's rows
  const int KT = static_cast<int>((me - mb + kBK - 1) / kBK);  // >= 1: the plan makes no empty chunk
  // A last o tile of 64 channels or fewer (d % 128 in 1 .. 64: ViT-B's d = 192, 576) leaves consumer
  // warpgroup 2 (o rows 64-127) nothing: it idles, its grad_y boxes are not loaded, and the stages
  // wait for warpgroup 1's four warps only.
  const bool upper_idle = tile.a * kBD + 64 >= p.na;
  const int consumer_warps = upper_idle ? 4 : 8;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kGyStages; ++s) {
      mbar_init(bar.gy_full + 8 * s, 1);
      mbar_init(bar.gy_empty + 8 * s, consumer_warps);
    }
    for (int s = 0; s < kXStages; ++s) {
      mbar_init(bar.x_full + 8 * s, 1);
      mbar_init(bar.x_empty + 8 * s, kXformWarps);
    }
    for (int b = 0; b < kPlaneBufs; ++b) {
      mbar_init(bar.ready + 8 * b, kXformWarps);
      mbar_init(bar.pfree + 8 * b, consumer_warps);
    }
    mbar_fence_init();
  }
  __syncthreads();
  // Launched with programmatic dependent launch (eq_pdl.cuh): no global memory is touched before this.
  pdl_wait();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    setmaxnreg_dec<56>();
    if (threadIdx.x == 0) {
      tma_prefetch_desc(&tm_gy);
      tma_prefetch_desc(&tm_x);
      const int o0 = tile.a * kBD, c0 = tile.b * kBC;
      // The map of grad_y's part that holds channel ch (a part holds whole boxes), and ch's column there.
      const auto gy_box = [&](const CUtensorMap* part0, int ch, int& col) {
        const int q = (ch >= p.g_part) + (ch >= 2 * p.g_part);
        col = (ch - q * p.g_part) * 4;
        return q == 0 ? part0 : q == 1 ? &tm_g1 : &tm_g2;
      };
      for (int kt = 0; kt < KT; ++kt) {
        const int row = static_cast<int>(mb) + kt * kBK;  // < 2^31: the host bounds M
        const int sg = kt % kGyStages, sx = kt % kXStages;
        if (kt >= kGyStages) mbar_wait(bar.gy_empty + 8 * sg, ((kt / kGyStages) - 1) & 1);
        mbar_arrive_expect_tx(bar.gy_full + 8 * sg, consumer_warps * kGyBox);
        for (int b = 0; b < consumer_warps; ++b) {  // box b: o rows 16 b .. 16 b + 15, consumer warp b's
          int col = (o0 + 16 * b) * 4;
          const CUtensorMap* const m = kSwap ? &tm_gy : gy_box(&tm_gy, o0 + 16 * b, col);
          tma_load_2d(base + sg * kGyBytes + b * kGyBox, m, col, row, bar.gy_full + 8 * sg);
        }
        if (kt >= kXStages) mbar_wait(bar.x_empty + 8 * sx, ((kt / kXStages) - 1) & 1);
        mbar_arrive_expect_tx(bar.x_full + 8 * sx, kXBytes);
        int col = c0 * 4;
        const CUtensorMap* const m = kSwap ? gy_box(&tm_x, c0, col) : &tm_x;
        tma_load_2d(base + kXOff + sx * kXBytes, m, col, row, bar.x_full + 8 * sx);
      }
    } else if (threadIdx.x >= 32) {
      transform_x<T, kSwap>(p, tile, base, bar, KT);
    }
  } else {
    setmaxnreg_inc<224>();
    if (threadIdx.x < 256 || !upper_idle) consume<T, kSwap>(p, tile, base, bar, KT);
  }
#else
  (void)tm_gy, (void)tm_x, (void)tm_g1, (void)tm_g2, (void)p;
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
  const int64_t d_part = a.d / a.gy_parts;  // grad_y's row: the part's width
  const int64_t wa = kSwap ? na : d_part, wb = kSwap ? d_part : nb;
  CUtensorMap tm_a, tm_b, tm_g[2];
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(4 * wa), static_cast<cuuint64_t>(a.M)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(4 * kE) * wa};
  const cuuint32_t a_box[2] = {64, kBK};  // 16 channels x 4 group values: 128 bytes
  const cuuint64_t b_dims[2] = {static_cast<cuuint64_t>(4 * wb), static_cast<cuuint64_t>(a.M)};
  const cuuint64_t b_strides[1] = {static_cast<cuuint64_t>(4 * kE) * wb};
  const cuuint32_t b_box[2] = {4 * kBC, kBK};  // 64 channels x 4 group values: 512 bytes
  if (!encode(&tm_a, pa, kE, 2, a_dims, a_strides, a_box, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode(&tm_b, pb, kE, 2, b_dims, b_strides, b_box, CU_TENSOR_MAP_SWIZZLE_NONE))
    return cudaErrorInvalidValue;
  tm_g[0] = tm_g[1] = kSwap ? tm_b : tm_a;  // (unused with fewer parts)
  for (int q = 1; q < a.gy_parts; ++q) {
    const bool ok = kSwap ? encode(&tm_g[q - 1], a.gy_part[q - 1], kE, 2, b_dims, b_strides, b_box,
                                   CU_TENSOR_MAP_SWIZZLE_NONE)
                          : encode(&tm_g[q - 1], a.gy_part[q - 1], kE, 2, a_dims, a_strides, a_box,
                                   CU_TENSOR_MAP_SWIZZLE_128B);
    if (!ok) return cudaErrorInvalidValue;
  }
  auto kernel = eq_bwd_weight_sm90_kernel<T, kSwap>;
  const cudaError_t e = set_max_dynamic_smem(kernel, kSmem);
  if (e != cudaSuccess) return e;
  const int64_t grid_a = (na + kBD - 1) / kBD, grid_b = (nb + kBC - 1) / kBC;
  const int S_last = a.S_last > 0 ? a.S_last : a.S;
  const int64_t chunk_last = a.S_last > 0 ? a.chunk_rows_last : a.chunk_rows;
  const int64_t blocks = ((grid_a - 1) * a.S + S_last) * grid_b;
  if (a.S < 1 || S_last < 1 || S_last > a.S || blocks > 0x7fffffff || (kSwap && S_last != a.S))
    return cudaErrorInvalidConfiguration;
  KParams kp{a.ws, a.ws_bias, a.M, a.chunk_rows, chunk_last, a.c, a.d, a.ldw, static_cast<int>(na),
             static_cast<int>(grid_a), static_cast<int>(grid_b), a.S, S_last,
             // one part: no box falls past it (those past d stay zero-filled by part 0's map)
             a.gy_parts > 1 ? static_cast<int>(d_part) : 1 << 29};
  return launch_maybe_pdl(dim3(unsigned(blocks)), dim3(kThreads), kSmem, stream, kernel, tm_a, tm_b, tm_g[0], tm_g[1],
                          kp);
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
  const char* v = debug_switch("wgrad_swap");
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
