// Fused p4 EQ-Linear forward for Hopper (sm_90a): TMA loads, register-A wgmma, fp16 and bf16 from one
// template. Math and layouts: eq_linear_fwd.h; the portable kernels (eq_linear_fwd_mma.cu) share the
// group transform's formulas, the epilogue and the block order.
//
// Tile: 128 rows x 64 output channels x the 4 accumulator sets (a0, a2, aR, aI), K = c in steps of
// BK = 32 channels. Persistent: one block per SM walks the tiles (grouped order, see grouped_tile;
// the group size: fwd_sm90) with a stride of the grid size. Warpgroup 0 is the producer: one thread
// issues per k tile the TMA loads of a stage of a 4-stage ring, completing on the stage's "full"
// mbarrier, running ahead into the next tile while the consumers finish the current one;
// warpgroups 1 and 2 are the consumers (rows 0-63 and 64-127) and release a stage through its
// "empty" mbarrier (one arrival per warp) once the wgmma groups that read it have retired. So the
// pipeline fill of a tile overlaps the previous tile's epilogue. setmaxnreg moves registers from the
// producer (24) to the consumers (240: 128 accumulators, 32 double-buffered A registers, 32 of raw
// x); 56 / 224 in the xf-writing variant (below).
// Clusters of two CTAs on one m tile share its x through TMA multicast (kCl, by default for 16-bit
// layers with an even count of at least 8 n tiles, see sm90_clusters): a third less L2 traffic.
// Before persistence this measured no faster; since then, and with the kernel at the board's power
// cap, faster on average at c = 1024 / 2048 (measurements: docs/kernels.md, Hopper forward).

// Shared memory per stage (48 KB, 1024-byte aligned):
//   x   2 x [128 rows][128 B]: 16 channels x 4 group values of rows m0.. (TMA box {64, 128} of x
//       viewed as (M, 4c)), 128-byte swizzle: 16-byte chunk j of row r lands at chunk j ^ (r & 7).
//   planes [4][64 rows][64 B]: P0, PR, PI, P2 rows n0.., channels k0..k0+31 (TMA box {32, 64, 4} of
//       planes viewed as (4, d, c)), 64-byte swizzle: the K-major B operand of wgmma as is.
//
// A fragments (wgmma m64 register A = the mma.sync m16n8k16 A layout per warp): lane (gid, t) needs
// rows gid and gid + 8 of its warp's 16, channels 2t, 2t+1 (regs 0, 1) and 2t+8, 2t+9 (regs 2, 3);
// the 4 group values of 2 channels are one 16-byte chunk (t, resp. t + 4), so one LDS.128 yields the
// packed register of all four transformed planes (F0, FR, FI, F2). The row order: fragment row g
// (and g + 8) of a warp is its tile row (g >> 1) + 4 (g & 1), so the two rows one quarter-warp
// reads differ in bit 2 and their chunks t ^ r fall in opposite 64-byte halves of the 128-byte
// swizzle: each LDS.128 covers all 32 banks once, with the same chunk (k lo, then k hi) for every
// lane. (Rows g, g + 1 would share banks; loading odd rows' high chunk first and selecting cost 16
// SEL per k16 step. 64-byte rows double the TMA requests and measured slower: docs/kernels.md, Hopper
// forward.) The epilogue writes each accumulator row to the x row it came from.
// The transform runs in packed 16-bit arithmetic (xform_h2): half the instructions of FP32 math,
// which the profile showed limiting (the consumers issue the transform and the wgmma).
// Per k16 step six wgmma m64n64k16 (aR += FR PR, aI += FR PI, a0 += F0 P0, a2 += F2 P2,
// aR += -FI PI via the A scale immediate, aI += FI PR) form one commit group; the A registers are
// double buffered so the next step's fragments are built while this group runs, and each step's
// raw x is loaded two steps ahead, before waiting for the previous group (the consumers' latency
// between groups sets the pace: one step ahead was faster, and the second step with the row order
// faster again at c >= 512). Building the whole next step before the wait (a third fragment
// buffer) measured no faster (docs/kernels.md, Hopper forward).
//
// Epilogue: the inverse transform + bias in FP32 registers, one 16-byte store per (row, o pair) of
// the interleaved (M, d, 4) output. The kGelu variants (FwdParams::gelu: the first layer of an MLP in
// inference) store GELU of it instead, saving a pass over the hidden activation. For
// training, GELU with the pre-activation also stored, and GELU' in the second layer's grad_x epilogue
// (h prefetched into L2, loaded one n8 block ahead), both measured slower than the separate passes at
// ViT-B / -L sizes: erf's ~35 instructions per element lengthen the epilogue, which sets the pace at
// short K (docs/kernels.md, Hopper forward).
//
// Optional by-product (fp16 / bf16, FwdParams::xf): x's Fourier planes as column blocks (M, 4c), for a
// backward that would otherwise make them in a pass of its own. Warps 1-3 of the producer warpgroup
// (idle otherwise) read x tiles (conflict-free LDS.128: a quarter-warp reads the 8 chunks of one row,
// a half-warp one row's 32 channels, so a warp's store of a plane is two 64-byte segments), transform
// in FP32, round once and store; each (row tile, k tile) is written by one block of the row tile's
// num_n, the one whose n tile is k tile % num_n, so the stores spread over the blocks. They read a
// second copy of those x tiles, which the producer loads into a buffer of their own (32 KB), not the
// ring's stage, which they would hold (slower: docs/kernels.md, Hopper forward). Before loading the next copy
// the producer waits until the writers have read the previous one (and issues no ring loads meanwhile).
// With xf_sums they also sum f0 in FP32 per (row tile, writer warp) before rounding (grad_bias). The
// variant costs kernel time, about half of it from its register split and shared-memory size alone
// (docs/kernels.md, Hopper forward).
//
// x and y in parts (FwdParams::x_parts, y_parts: column blocks in tensors of their own, e.g. an attention's
// q, k, v and their gradients): x through one tensor map per part, the producer picking k tile kt's (a part
// holds whole k tiles); the epilogue stores each n tile into its part of y (a part holds whole n tiles).
//
// Requirements (checked by the host, which otherwise falls back to the portable kernels): an sm_90
// device running sm_90a code, c % 8 == 0 (TMA row strides are multiples of 16 bytes), d even, x,
// planes and y 16-byte aligned, bias 4-byte aligned, M < 2^31 - 128 (TMA coordinates are 32-bit).
// An FP32 y (FwdParams::y_f32) with fp16 / bf16 inputs: the plain variant only (no xf, no GELU).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_func_attr.cuh"
#include "eq_linear_fwd.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_linear_mma_common.cuh"
#include "eq_linear_sm90.cuh"
#include "eq_pdl.cuh"
#include "eq_sm90_host.cuh"
#include "eq_switches.h"

namespace flash_eqlinear {
namespace {

constexpr int kBM = 128, kBN = 64, kStages = 4;
// Channels per stage: a stage holds 64-byte plane rows and two 128-byte x rows per tile row whatever
// the element type, so 32 channels of fp16 / bf16 and 16 of float (TF32). Each k step (k16 of 16-bit
// wgmma, k8 of TF32) covers 32 bytes of a plane row and one 128-byte x sub-tile: the byte layout,
// the descriptors and the A fragment addressing are the same for all three types.
template <class T>
constexpr int kBK = 64 / int(sizeof(T));
constexpr int kConsumerWarps = 8, kThreads = 128 + 32 * kConsumerWarps;
constexpr uint32_t kXSub = kBM * 128;          // one 16-channel x sub-tile: 16 KB
constexpr uint32_t kPlane = kBN * 64;           // one plane tile: 4 KB
constexpr uint32_t kStageBytes = 2 * kXSub + 4 * kPlane;
constexpr int kSmem = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + barriers + alignment slack
// The xf-writing variant: a second copy of the x tile of each stage it writes, in a buffer of its own
// (1024-aligned after the barrier area, which then also holds its two barriers): 226 KB of the 227.
constexpr uint32_t kXfBufOffset = kStages * kStageBytes + 1024;
constexpr int kSmemXf = kXfBufOffset + 2 * kXSub + 1024;
static_assert(2 * kStages * 8 + 16 <= 1024, "the barriers before the writers' buffer");

struct Sm90Params {
  const void* bias;  // (d,) or nullptr
  void* y;           // (M, d, 4), or with parts (FwdParams::y_parts) part 0 of y, y1, y2: (M, d_part, 4) each
  void* y1;
  void* y2;
  void* xf;          // (M, 4c) or nullptr: FwdParams::xf
  float* xf_sums;    // (3 num_m, c) or nullptr: FwdParams::xf_sums
  float xf_scale;
  int64_t M;
  int c, d, k_tiles, num_m, num_n;
  int d_part;   // output channels per part of y (d: one part); a multiple of kBN with parts
  int kt_part;  // k tiles per part of x (FwdParams::x_parts; k_tiles: one part)
  int group_m;  // m tiles per group of the walk (see tile_origin)
  int num_ng;   // n groups: num_n / the cluster size, rounded up
};
constexpr int kXfWarps = 3;  // producer warps 1-3 write xf
static_assert(32 * (1 + kXfWarps) == 128, "the producer warpgroup: the TMA warp and the xf writers");
static_assert(eq_linear_fwd_sm90_sum_rows(1) == kXfWarps && eq_linear_fwd_sm90_sum_rows(kBM + 1) == 2 * kXfWarps,
              "xf_sums rows, as the host allocates them: kXfWarps per kBM-row tile");

// Walk step i (one per cluster) -> (first row, first output channel) of this CTA's tile: groups of
// p.group_m m tiles, each walked n group by n group; CTA rank of a cluster of kCl takes n tile
// kCl * n group + rank (past d with an odd count: planes arrive as zeros, nothing is stored).
// (A template only so that targets without the kernel body, which never call it, do not warn.)
template <int kCl, class P>
__device__ __forceinline__ void tile_origin(const P& p, int tile, int rank, int& m0, int& n0) {
  int m_tile, n_group;
  grouped_tile(tile, p.num_m, p.num_ng, m_tile, n_group, p.group_m);  // 32-bit: the host bounds the count
  m0 = m_tile * kBM;
  n0 = (n_group * kCl + rank) * kBN;
}

// TF32 counterpart of xform_h2: one channel's 4 group values (FP32) -> its F0, FR, FI, F2 fragment
// registers, rounded to TF32 (to nearest; the tensor cores would truncate).
// (Templates only so that targets without the kernel body, which never call them, do not warn.)
template <int = 0>
__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
  return r;
}

template <int = 0>
__device__ __forceinline__ void xform_tf32(const uint4 v, uint32_t& F0, uint32_t& FR, uint32_t& FI, uint32_t& F2) {
  const float x0 = __uint_as_float(v.x), x1 = __uint_as_float(v.y), x2 = __uint_as_float(v.z),
              x3 = __uint_as_float(v.w);
  float f0, fr, fi, f2;
  dft4<false>(x0, x1, x2, x3, f0, fr, fi, f2);
  F0 = to_tf32(f0);
  F2 = to_tf32(f2);
  FR = to_tf32(fr);
  FI = to_tf32(fi);
}

// The consumer warpgroups (warps 4-11): main loop and epilogue of each tile of the walk.
// kGelu: the epilogue stores GELU of the output (FwdParams::gelu). kF32Out (16-bit T): y is FP32
// (FwdParams::y_f32), stored as the TF32 kernel stores it.
template <class T, int kCl, bool kGelu, bool kF32Out = false>
__device__ __forceinline__ void consume(const Sm90Params& p, uint32_t base, uint32_t full_bar, uint32_t empty_bar,
                                        int num_tiles) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, t = lane & 3;
  // Fragment row gid is tile row rg of the warp's 16 (header: the row order); rg & 7 == rg.
  const int rg = (gid >> 1) + 4 * (gid & 1);
  const int row = (warp - 4) * 16 + rg;  // tile row of regs 0/2; +8 for regs 1/3
  // The row's 16-byte chunks of channels 2t, 2t+1 (k lo) and 2t+8, 2t+9 (k hi), swizzled
  const uint32_t x_lo = row * 128 + ((t ^ rg) << 4), x_hi = row * 128 + (((t + 4) ^ rg) << 4);
  const uint64_t desc0 = wgmma_desc_sw64(base + 2 * kXSub);  // stage 0, plane P0, k16 step 0
  const int KT = p.k_tiles;
  const T* bias = static_cast<const T*>(p.bias);
  using TOut = std::conditional_t<kF32Out, float, T>;

  uint32_t it = 0;  // k tiles consumed so far, over all tiles: stage it % kStages, phase (it / kStages) & 1
  // Releases a stage: to this CTA's producer, and with a cluster to the partner's, which multicasts
  // its x sub-tile into this CTA's stage too.
  // (The partner's rank is re-read where used: the consumers have no register to spare.)
  auto release = [&](uint32_t s) {
    mbar_arrive(empty_bar + 8 * s);
    if constexpr (kCl > 1) mbar_arrive_cluster(cluster_map(empty_bar + 8 * s, cluster_ctarank() ^ 1));
  };
  for (int tile = blockIdx.x / kCl; tile < num_tiles; tile += gridDim.x / kCl) {
    int m0, n0;
    tile_origin<kCl>(p, tile, kCl > 1 ? static_cast<int>(cluster_ctarank()) : 0, m0, n0);
    // The tile's bias pairs (o, o+1) for o = n0 + 8 j + 2 t, loaded now: their latency hides behind
    // the main loop instead of stalling the epilogue. (TF32's float2 pairs too: loaded in the epilogue
    // they measured slower at c = 32 .. 2048, docs/kernels.md, Hopper forward.)
    using BiasPair = std::conditional_t<sizeof(T) == 2, uint32_t, float2>;
    BiasPair bias2[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int o = n0 + 8 * j + 2 * t;
      bias2[j] = (bias != nullptr && o < p.d) ? __ldg(reinterpret_cast<const BiasPair*>(bias + o)) : BiasPair{};
    }
    float acc[4][8][4];  // sets: 0 = a0, 1 = a2, 2 = aR, 3 = aI; [n8 block][C fragment]
    zero_acc(acc);

    uint32_t fa[2][4][4] = {};  // [buffer = k16 step parity][F0, FR, FI, F2][A fragment register]
    // Raw x of k16 steps (k tile, 0) and (k tile, 1): v[ks][r] is fragment register r's chunk (rows
    // row, row + 8 of k lo, then of k hi), loaded two steps ahead (the previous k tile's step ks)
    // so that the shared-memory latency overlaps two groups.
    uint4 v[2][4];
    auto load_x = [&](uint4(&w)[4], uint32_t xs) {
      w[0] = lds128(xs + x_lo);
      w[1] = lds128(xs + x_lo + 8 * 128);
      w[2] = lds128(xs + x_hi);
      w[3] = lds128(xs + x_hi + 8 * 128);
    };
    mbar_wait(full_bar + 8 * (it % kStages), (it / kStages) & 1);
    load_x(v[0], base + (it % kStages) * kStageBytes);
    load_x(v[1], base + (it % kStages) * kStageBytes + kXSub);
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int s = it % kStages;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t(&f)[4][4] = fa[ks];
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // fragment register r: row + 8 (r & 1), k hi (r >> 1)
          if constexpr (sizeof(T) == 2)
            xform_h2<T>(v[ks][r], f[0][r], f[1][r], f[2][r], f[3][r]);
          else
            xform_tf32(v[ks][r], f[0][r], f[1][r], f[2][r], f[3][r]);
        }
        const uint64_t dk = desc0 + ((s * kStageBytes + ks * 32) >> 4);
        const uint64_t d0 = dk, dr = dk + (kPlane >> 4), di = dk + (2 * kPlane >> 4), d2 = dk + (3 * kPlane >> 4);
        wgmma_fence();
        wgmma_m64n64_rs<T, 1>(acc[2], f[1], dr);
        wgmma_m64n64_rs<T, 1>(acc[3], f[1], di);
        wgmma_m64n64_rs<T, 1>(acc[0], f[0], d0);
        wgmma_m64n64_rs<T, 1>(acc[1], f[3], d2);
        wgmma_m64n64_rs<T, -1>(acc[2], f[2], di);
        wgmma_m64n64_rs<T, 1>(acc[3], f[2], dr);
        wgmma_commit();
        if (kt + 1 < KT) {  // v[ks] is in f now: load this step's sub-tile of the next k tile
          const uint32_t next = (it + 1) % kStages;
          if (ks == 0) mbar_wait(full_bar + 8 * next, ((it + 1) / kStages) & 1);
          load_x(v[ks], base + next * kStageBytes + ks * kXSub);
        }
        wgmma_wait<1>();  // the previous step's group has retired: its A buffer (and stage) are free
#pragma unroll
        for (int op = 0; op < 4; ++op) reg_fence(fa[ks ^ 1][op]);
        // At ks == 0 that previous group was k tile it-1's last: release its stage.
        if (ks == 0 && kt > 0 && lane == 0) release((it - 1) % kStages);
      }
    }
    wgmma_retire_all(acc, fa);
    if (lane == 0) release((it - 1) % kStages);  // the tile's last stage

    // ---- epilogue ----
    // The part of y the tile falls in (a part holds whole tiles) and the tile's columns there.
    const int part = (n0 >= p.d_part) + (n0 >= 2 * p.d_part);
    TOut* const y = static_cast<TOut*>(part == 0 ? p.y : part == 1 ? p.y1 : p.y2);
    const int o_part = part * p.d_part;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int o = n0 + 8 * j + 2 * t;
      if (o >= p.d) continue;  // d even: o + 1 < d too
      float2 bo2;
      if constexpr (sizeof(T) == 2)
        bo2 = Elem<T>::unpack(bias2[j]);
      else
        bo2 = bias2[j];
      const float bo[2] = {bo2.x, bo2.y};
#pragma unroll
      for (int r8 = 0; r8 < 2; ++r8) {
        const int64_t m = static_cast<int64_t>(m0) + row + 8 * r8;
        if (m >= p.M) continue;
        if constexpr (sizeof(TOut) == 2) {
          uint32_t out[2][2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int e = 2 * r8 + i;
            inverse_dft4<T>(acc[0][j][e], acc[1][j][e], acc[2][j][e], acc[3][j][e], bo[i], out[i][0], out[i][1]);
            if constexpr (kGelu) {
              out[i][0] = gelu_pair<T>(out[i][0]);
              out[i][1] = gelu_pair<T>(out[i][1]);
            }
          }
          *reinterpret_cast<uint4*>(y + (m * p.d_part + o - o_part) * 4) =
              make_uint4(out[0][0], out[0][1], out[1][0], out[1][1]);
        } else {  // two 16-byte stores: channels o and o + 1
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int e = 2 * r8 + i;
            float4 r;
            if constexpr (sizeof(T) == 2)  // an FP32 y of 16-bit inputs (kF32Out): fp16's products are halved
              r = inverse_dft4_f32<Elem<T>::kHalve>(acc[0][j][e], acc[1][j][e], acc[2][j][e], acc[3][j][e], bo[i]);
            else
              r = inverse_dft4_f32(acc[0][j][e], acc[1][j][e], acc[2][j][e], acc[3][j][e], bo[i]);
            if constexpr (kGelu) r = make_float4(gelu_f32(r.x), gelu_f32(r.y), gelu_f32(r.z), gelu_f32(r.w));
            *reinterpret_cast<float4*>(y + (m * p.d_part + o - o_part + i) * 4) = r;
          }
        }
      }
    }
  }
}

// Producer warps 1-3: x's Fourier planes of the k tiles that fall to this block (header), from the copy
// of each that the producer loads into their buffer xbuf (xfull: landed; xempty: read, reusable).
template <class T>
__device__ __forceinline__ void write_xf(const Sm90Params& p, uint32_t xbuf, uint32_t xfull, uint32_t xempty,
                                         int num_tiles) {
  const int wt = threadIdx.x - 32, lane = threadIdx.x & 31;  // wt: 0 .. 32 kXfWarps - 1
  T* xf = static_cast<T*>(p.xf);
  const int64_t ld = 4 * static_cast<int64_t>(p.c);
  uint32_t wi = 0;  // x tiles written so far (as the producer counts its loads into xbuf)
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    int m0, n0;
    tile_origin<1>(p, tile, 0, m0, n0);
    const int rows = static_cast<int>(std::min<int64_t>(kBM, p.M - m0));
    // this warp's f0 sums of the row tile: row (m0 / kBM) kXfWarps + wt / 32 of xf_sums
    const int64_t sums_row = m0 / kBM * kXfWarps + wt / 32;
    float* const sums = p.xf_sums == nullptr ? nullptr : p.xf_sums + sums_row * p.c;
    for (int kt = n0 / kBN; kt < p.k_tiles; kt += p.num_n) {  // the k tiles that fall to this block
      mbar_wait(xfull, wi & 1);
      // Thread wt: chunk j = wt % 8 (channels 2j, 2j + 1) of sub-tile (wt / 8) % 2 in rows wt / 16, + 6, ...;
      // a half-warp covers a row's 32 channels, so each plane store of a warp is two 64-byte segments.
      const int j = wt % 8, sub = (wt / 8) % 2;
      const int ch = kt * kBK<T> + sub * 16 + 2 * j;  // c % 8 == 0: ch < c implies ch + 1 < c
      constexpr int kRowStep = 32 * kXfWarps / 16;
      float2 sum = make_float2(0.f, 0.f);  // f0's sums (channels ch, ch + 1)
      if (ch < p.c) {
        T* dst = xf + (static_cast<int64_t>(m0) + wt / 16) * ld + ch;
        for (int r = wt / 16; r < rows; r += kRowStep, dst += kRowStep * ld) {
          const uint4 v = lds128(xbuf + sub * kXSub + r * 128 + ((j ^ (r & 7)) << 4));
          const float2 a = Elem<T>::unpack(v.x), b = Elem<T>::unpack(v.y);  // channel ch
          const float2 e = Elem<T>::unpack(v.z), g = Elem<T>::unpack(v.w);  // channel ch + 1
          float f[2][4];  // [channel][f0, f2, fR, fI]
          dft4<false>(a.x, a.y, b.x, b.y, f[0][0], f[0][2], f[0][3], f[0][1]);
          dft4<false>(e.x, e.y, g.x, g.y, f[1][0], f[1][2], f[1][3], f[1][1]);
          sum.x += f[0][0];
          sum.y += f[1][0];
#pragma unroll
          for (int pl = 0; pl < 4; ++pl)
            *reinterpret_cast<uint32_t*>(dst + pl * p.c) = Elem<T>::pack(p.xf_scale * f[0][pl], p.xf_scale * f[1][pl]);
        }
      }
      if (sums != nullptr) {  // lanes l and l ^ 16 hold the same channel pair: add them
        sum.x += __shfl_xor_sync(0xffffffffu, sum.x, 16);
        sum.y += __shfl_xor_sync(0xffffffffu, sum.y, 16);
        if (lane < 16 && ch < p.c) *reinterpret_cast<float2*>(sums + ch) = sum;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(xempty);
      ++wi;
    }
  }
}

// kXf: the variant whose producer warps 1-3 write xf (fp16 / bf16 only). Its writers get 56 registers
// (with the f0 sums; at 40 they spill), so its consumers get 224 instead of 240 (no spills
// either; 128 x 56 + 256 x 224 = 128 x 24 + 256 x 240 = the 384 x 168 registers a block holds from its
// launch: setmaxnreg.inc waits for registers the block's own setmaxnreg.dec released). The plain variant
// keeps 24 / 240.
// kCl = 2 (plain variant only): clusters of two CTAs on the same m tile and adjacent n tiles. Each
// producer loads one of a stage's two x sub-tiles and multicasts it to both CTAs, so x is read from
// L2 once per pair; each releases a stage only when the consumers of both CTAs have read it.
// kGelu (plain variant): the epilogue stores GELU of the output. kF32Out (plain variant, 16-bit T): an
// FP32 y (FwdParams::y_f32).
template <class T, bool kXf, int kCl = 1, bool kGelu = false, bool kF32Out = false>
__global__ void __launch_bounds__(kThreads, 1)
eq_linear_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_x1,
                          const __grid_constant__ CUtensorMap tm_x2, const __grid_constant__ CUtensorMap tm_p,
                          const Sm90Params p) {
#ifdef FLASH_EQLINEAR_WGMMA
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need aligned bases
  const uint32_t full_bar = base + kStages * kStageBytes, empty_bar = full_bar + 8 * kStages;
  const uint32_t xfull = empty_bar + 8 * kStages, xempty = xfull + 8, xbuf = base + kXfBufOffset;  // kXf only
  const int num_tiles = p.num_m * p.num_ng;  // steps of the walk (one per cluster)
  static_assert(kCl == 1 || (kCl == 2 && !kXf), "clusters of two, plain variant only");
  static_assert(!kGelu || !kXf, "the GELU epilogue: plain variant");
  static_assert(!kF32Out || (!kXf && !kGelu && sizeof(T) == 2), "the FP32 epilogue: plain 16-bit variant");
  const int rank = kCl == 1 ? 0 : static_cast<int>(cluster_ctarank());

  constexpr bool writes_xf = kXf && sizeof(T) == 2;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kCl * kConsumerWarps);
    }
    if (writes_xf) {
      mbar_init(xfull, 1);
      mbar_init(xempty, kXfWarps);
    }
    mbar_fence_init();
  }
  if constexpr (kCl > 1)
    cluster_sync();  // both CTAs' barriers are initialised before any multicast or remote arrival
  else
    __syncthreads();
  // Launched with programmatic dependent launch (eq_pdl.cuh): no global memory is touched before this.
  pdl_wait();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    setmaxnreg_dec<kXf ? 56 : 24>();
    if (writes_xf && threadIdx.x >= 32) {
      if constexpr (writes_xf) write_xf<T>(p, xbuf, xfull, xempty, num_tiles);
    } else if (threadIdx.x == 0) {
      tma_prefetch_desc(&tm_x);
      if (p.kt_part < p.k_tiles) {
        tma_prefetch_desc(&tm_x1);
        tma_prefetch_desc(&tm_x2);
      }
      tma_prefetch_desc(&tm_p);
      uint32_t it = 0;  // k tiles issued so far, over all tiles (wraps harmlessly: kStages divides 2^32)
      uint32_t wi = 0;  // x tiles loaded into the writers' buffer so far
      for (int tile = blockIdx.x / kCl; tile < num_tiles; tile += gridDim.x / kCl) {
        int m0, n0;
        tile_origin<kCl>(p, tile, rank, m0, n0);
        for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
          const int s = it % kStages;
          if (it >= kStages) mbar_wait(empty_bar + 8 * s, ((it / kStages) - 1) & 1);
          const uint32_t st = base + s * kStageBytes, bar = full_bar + 8 * s;
          mbar_arrive_expect_tx(bar, kStageBytes);  // with a cluster, one x sub-tile from the partner
          // k tile kt's part of x (Sm90Params::kt_part: a part holds whole k tiles), its column there
          const int xp = (kt >= p.kt_part) + (kt >= 2 * p.kt_part);
          const CUtensorMap* const mx = xp == 0 ? &tm_x : xp == 1 ? &tm_x1 : &tm_x2;
          const int xc = (kt - xp * p.kt_part) * kBK<T> * 4;
          if constexpr (kCl == 1) {
            tma_load_2d(st, mx, xc, m0, bar);
            tma_load_2d(st + kXSub, mx, xc + 2 * kBK<T>, m0, bar);
          } else {
            tma_load_2d_multicast(st + rank * kXSub, mx, xc + rank * 2 * kBK<T>, m0, bar, 0x3);
          }
          tma_load_3d(st + 2 * kXSub, &tm_p, kt * kBK<T>, n0, 0, bar);
          if (writes_xf && kt % p.num_n == n0 / kBN) {  // this block writes k tile kt's planes: a copy
            if (wi > 0) mbar_wait(xempty, (wi - 1) & 1);  // of its x tile for the writers
            mbar_arrive_expect_tx(xfull, 2 * kXSub);
            tma_load_2d(xbuf, mx, xc, m0, xfull);
            tma_load_2d(xbuf + kXSub, mx, xc + 2 * kBK<T>, m0, xfull);
            ++wi;
          }
        }
      }
    }
  } else {
    setmaxnreg_inc<kXf ? 224 : 240>();
    consume<T, kCl, kGelu, kF32Out>(p, base, full_bar, empty_bar, num_tiles);
    // No CTA exits while its partner may still write to it or arrive on its barriers: every multicast
    // into a CTA and every remote arrival precedes its partner's consumers' last wait or arrival.
    // (The cluster barrier waits for the threads that have not exited: the producer warps need not
    // take part, and with them it spills at 24 registers.)
    if constexpr (kCl > 1) cluster_sync();
  }
#else
  (void)tm_x, (void)tm_x1, (void)tm_x2, (void)tm_p, (void)p;
  __trap();
#endif
}

// ---- host side -------------------------------------------------------------------------------------
template <class T>
bool runs_sm90a(int dev) {
  static int8_t known[64] = {};
  return kernel_runs_sm90a(eq_linear_fwd_sm90_kernel<T, false>, dev, known);
}

bool aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

// Whether the plain forward runs in clusters of two CTAs sharing x: FLASH_EQLINEAR_DEBUG sm90_cluster=1
// never, =2 wherever there are two n tiles; by default for 16-bit layers with an even count of at least 8 n
// tiles (d > 448). With an odd count the last pair computes a tile past d, and with few n tiles the
// walk's last wave is coarser: clusters measured slower than single CTAs at 3 and 9 n tiles, no faster
// at 2 and 4, and no slower at 8, 12, 16 and 32 (docs/kernels.md, Hopper forward).
bool sm90_clusters(int64_t num_n, int elem_bytes) {
  const char* v = debug_switch("sm90_cluster");
  if (v != nullptr && std::strcmp(v, "1") == 0) return false;
  if (v != nullptr && std::strcmp(v, "2") == 0) return true;
  return elem_bytes == 2 && num_n % 2 == 0 && num_n >= 8;
}

template <class T>
cudaError_t fwd_sm90(const FwdParams& p, cudaStream_t stream, bool* launched) {
  *launched = false;
  constexpr int kE = sizeof(T);
  if (!sm90_path_enabled() || p.M <= 0 || p.M > 0x7fffffff - kBM || (p.c * kE) % 16 != 0 || p.d % 2 != 0 ||
      p.c > 0x3fffffff / 4 || p.d > 0x7fffffff - kBN || !aligned16(p.x) || !aligned16(p.planes) || !aligned16(p.y) ||
      reinterpret_cast<uintptr_t>(p.bias) % (2 * kE) != 0 || (p.xf != nullptr && (kE == 4 || !aligned16(p.xf))) ||
      (p.gelu && p.xf != nullptr) || (p.y_f32 && (p.gelu || p.xf != nullptr)))
    return cudaSuccess;
  // Parts (FwdParams::x_parts, y_parts): each holds whole k tiles of x, whole n tiles of y.
  const auto parts_ok = [](int n, int64_t width, int64_t tile, const void* a, const void* b) {
    return n == 1 || ((n == 2 || n == 3) && width % (n * tile) == 0 && aligned16(a) && (n == 2 || aligned16(b)));
  };
  if (!parts_ok(p.x_parts, p.c, kBK<T>, p.x1, p.x2) || !parts_ok(p.y_parts, p.d, kBN, p.y1, p.y2))
    return cudaSuccess;
  int dev = 0, major = 0, smem_optin = 0, num_sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  const int smem = p.xf != nullptr ? kSmemXf : kSmem;
  if (major != 9 || smem_optin < smem || !runs_sm90a<T>(dev)) return cudaSuccess;

  const int64_t num_m = (p.M + kBM - 1) / kBM, num_n = (p.d + kBN - 1) / kBN;
  if (num_m * num_n > 0x7fffffff - 1024) return cudaSuccess;  // int tile ids (+ the grid stride)
  const bool f32_out = p.y_f32 && kE == 2;  // (TF32's y is FP32 anyway)

  CUtensorMap tm_x, tm_x1, tm_x2, tm_p;
  const int64_t c_part = p.c / p.x_parts;
  const cuuint64_t x_dims[2] = {static_cast<cuuint64_t>(4 * c_part), static_cast<cuuint64_t>(p.M)};
  const cuuint64_t x_strides[1] = {static_cast<cuuint64_t>(4 * kE * c_part)};
  const cuuint32_t x_box[2] = {128 / kE, kBM};
  const auto encode_x = [&](CUtensorMap* map, const void* ptr) {
    return encode(map, ptr, kE, 2, x_dims, x_strides, x_box, CU_TENSOR_MAP_SWIZZLE_128B);
  };
  const cuuint64_t p_dims[3] = {static_cast<cuuint64_t>(p.c), static_cast<cuuint64_t>(p.d), 4};
  const cuuint64_t p_strides[2] = {static_cast<cuuint64_t>(kE * p.c), static_cast<cuuint64_t>(kE * p.c * p.d)};
  const cuuint32_t p_box[3] = {kBK<T>, kBN, 4};
  if (!encode_x(&tm_x, p.x) || !encode(&tm_p, p.planes, kE, 3, p_dims, p_strides, p_box, CU_TENSOR_MAP_SWIZZLE_64B))
    return cudaSuccess;  // no encoder (old driver) or a shape it rejects: the portable kernel runs
  tm_x1 = tm_x2 = tm_x;  // (unused with fewer parts)
  if ((p.x_parts > 1 && !encode_x(&tm_x1, p.x1)) || (p.x_parts > 2 && !encode_x(&tm_x2, p.x2))) return cudaSuccess;

  Sm90Params kp;
  kp.bias = p.bias;
  kp.y = p.y;
  kp.y1 = p.y1;
  kp.y2 = p.y2;
  kp.xf = p.xf;
  kp.xf_sums = p.xf_sums;
  kp.xf_scale = p.xf_scale;
  kp.M = p.M;
  kp.c = static_cast<int>(p.c);
  kp.d = static_cast<int>(p.d);
  kp.k_tiles = static_cast<int>((p.c + kBK<T> - 1) / kBK<T>);
  kp.num_m = static_cast<int>(num_m);
  kp.num_n = static_cast<int>(num_n);
  kp.d_part = static_cast<int>(p.d / p.y_parts);
  kp.kt_part = static_cast<int>(c_part / kBK<T>);
  if (p.x_parts == 1) kp.kt_part = kp.k_tiles;  // (c need not be a multiple of the k tile)
  // Groups of 2 m tiles while the planes fit in about two thirds of L2 (H100: 50 MB): the blocks in
  // flight then cover every n tile, the planes stay resident, and x is read from DRAM about once
  // (faster than groups of 8 at c = d = 2048: docs/kernels.md, Hopper forward). Larger planes are streamed
  // once per group: groups of 8 m tiles read them a quarter as often.
  kp.group_m = 4 * kE * p.c * p.d <= (int64_t{32} << 20) ? 2 : 8;
  if (p.xf == nullptr && num_n > 1 && sm90_clusters(num_n, kE)) {  // clusters of two sharing x (the kernel, kCl)
    auto kernel = p.gelu    ? eq_linear_fwd_sm90_kernel<T, false, 2, true>
                  : f32_out ? eq_linear_fwd_sm90_kernel<T, false, 2, false, kE == 2>
                            : eq_linear_fwd_sm90_kernel<T, false, 2>;
    e = set_max_dynamic_smem(kernel, smem);
    if (e != cudaSuccess) return e;
    kp.num_ng = static_cast<int>((num_n + 1) / 2);
    cudaLaunchAttribute attr[2];  // the cluster shape, and room for launch_maybe_pdl's
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(static_cast<unsigned>(2 * std::min<int64_t>(num_m * kp.num_ng, num_sms / 2)));
    // Persistent clusters: no more than can be resident at once (a GPC holds whole clusters only).
    // Cached per device (benign race: every writer writes the same).
    static int max_clusters[64] = {};
    int clusters = 0;
    if (dev < 64) {
      if (max_clusters[dev] == 0) {
        int n = 0;
        e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
        if (e != cudaSuccess) return e;
        max_clusters[dev] = n > 0 ? n : -1;
      }
      clusters = max_clusters[dev];
    }
    if (clusters > 0) {
      cfg.gridDim = dim3(static_cast<unsigned>(2 * std::min<int64_t>(num_m * kp.num_ng, clusters)));
      *launched = true;
      return launch_maybe_pdl(cfg, attr, kernel, tm_x, tm_x1, tm_x2, tm_p, kp);
    }
  }
  kp.num_ng = kp.num_n;
  auto kernel = p.xf != nullptr ? eq_linear_fwd_sm90_kernel<T, true>
                : p.gelu        ? eq_linear_fwd_sm90_kernel<T, false, 1, true>
                : f32_out       ? eq_linear_fwd_sm90_kernel<T, false, 1, false, kE == 2>
                                : eq_linear_fwd_sm90_kernel<T, false>;
  e = set_max_dynamic_smem(kernel, smem);
  if (e != cudaSuccess) return e;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(num_m * num_n, num_sms));
  *launched = true;
  return launch_maybe_pdl(dim3(grid), dim3(kThreads), smem, stream, kernel, tm_x, tm_x1, tm_x2, tm_p, kp);
}

}  // namespace

cudaError_t eq_linear_fwd_sm90_fp16(const FwdParams& p, cudaStream_t stream, bool* launched) {
  return fwd_sm90<__half>(p, stream, launched);
}

cudaError_t eq_linear_fwd_sm90_bf16(const FwdParams& p, cudaStream_t stream, bool* launched) {
  return fwd_sm90<__nv_bfloat16>(p, stream, launched);
}

cudaError_t eq_linear_fwd_sm90_tf32(const FwdParams& p, cudaStream_t stream, bool* launched) {
  return fwd_sm90<float>(p, stream, launched);
}

}  // namespace flash_eqlinear
