// Fused p4 EQ-Linear forward on tensor cores (mma.sync m16n8k16, FP32 accumulation), fp16 and bf16
// from one template; sm_80 / sm_89 / sm_90. Math and layouts: eq_linear_fwd.h.
//
// GEMM view: rows m (M), output channels o (N = d), input channels ci (K = c). Four A operands
// F0 FR FI F2 are derived from x on the fly, four B operands are the planes P0 PR PI P2; per k16
// step and (m16, n8) tile six mma feed four FP32 accumulator sets a0 a2 aR aI.
//
// Tiling. A block computes BM rows x BN output channels for all 4 group values. Accumulators cost
// 4 * WM * WN / 32 floats per thread for a WM x WN warp tile (it is an ordinary WM x 4WN GEMM
// tile), so 16 x 64 (128 floats) is the widest that fits. Each warp turns its own raw x rows into
// A fragments once per k16 step (~28 scalar ops per LDS.128) and reuses them for 8 n8 tiles
// (48 mma). Configs: large 128x64 (8 warps as 8x1, one block per SM), small 64x64 (4 warps as
// 4x1, two blocks per SM on sm_90). Both use ~245 registers without spills: occupancy is set by
// the accumulators anyway, so the registers above ~200 buy scheduling freedom, not fewer warps.
//
// Shared memory, per pipeline stage (BK = 32 channels):
//   x tile      [BM][256 B]   row r = x[m0+r][k0..k0+31][0..3]; 16-byte chunk q (2 channels)
//                              stored at chunk q ^ ((r & 1) << 2)
//   planes tile [4*BN][64 B]  row p*BN+n = plane p, channel n0+n, k0..k0+31; 16-byte chunk q
//                              (8 channels) stored at chunk q ^ ((row >> 1) & 3)
// Both XOR swizzles make the fragment reads bank-conflict free (each quarter-warp of LDS.128 and
// each 8-row ldmatrix phase hits 8 distinct 16-byte bank groups).
// Stages are filled with 16-byte cp.async (zero-fill past M, c, d), 3-4 stages, one barrier per
// k tile placed before its last k16 step, so the next tile's A fragments and the refill overlap
// that step's mma. When c % 8 != 0 (or x / planes are not 16-byte aligned) rows are not 16-byte
// aligned: a general kernel fills the same layout with 8-byte cp.async (x) and 2-byte loads.
//
// Fragments (lane = 4 * gid + tid4). A (row-major m16 x k16): reg 0 = row gid, k 2tid4..+1;
// reg 1 = row gid+8; regs 2, 3 = the same rows at k + 8. For one (row, k pair) the raw
// x[row][k][0..3], x[row][k+1][0..3] are 8 consecutive elements, one LDS.128, from which the
// thread computes the packed (k, k+1) register of all four A planes (FP32 math, one rounding).
// B (k16 x n8, "col" = n rows of contiguous k): one ldmatrix.x4 per plane gives reg pairs for
// two n8 tiles (matrices: n 0-7 k lo, n 0-7 k hi, n 8-15 k lo, n 8-15 k hi).
// C: regs 0, 1 = row gid, columns 2tid4, 2tid4+1; regs 2, 3 = row gid+8. So a thread owns
// y[m][o..o+1][0..3], 8 consecutive elements: one 16-byte store per row.
//
// Scaling (fp16): the prologue computes f/2 (x0+x1+x2+x3 overflows fp16 for |x| > 16384, its
// half does not for |x| <= 32752), so with the kernel's a = a_header / 2 the epilogue is
//   y0 = a0 + a2 + s aR   y1 = a0 - a2 - s aI   y2 = a0 + a2 - s aR   y3 = a0 - a2 + s aI,
// s = sqrt2, + bias[o], in FP32 and rounded once. bf16 has the FP32 exponent range and uses the
// header's unscaled formulas (two multiplies fewer per channel).

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_func_attr.cuh"
#include "eq_linear_fwd.h"
#include "eq_linear_mma_common.cuh"

namespace flash_eqlinear {
namespace {

constexpr int kBK = 32;                // channels (K) per pipeline stage
constexpr int kXRowBytes = kBK * 4 * 2;  // 256 B: BK channels x 4 group values
constexpr int kPRowBytes = kBK * 2;      // 64 B

template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct TileCfg {
  static constexpr int kBM = BM_, kBN = BN_, kWarpsM = WARPS_M_, kWarpsN = WARPS_N_;
  static constexpr int kStages = STAGES_, kMinBlocks = MIN_BLOCKS_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;
  static constexpr int kMT = kWM / 16, kNT = kWN / 8;  // m16 / n8 tiles per warp
  static constexpr int kXStage = kBM * kXRowBytes;
  static constexpr int kPStage = 4 * kBN * kPRowBytes;
  static constexpr int kSmem = kStages * (kXStage + kPStage);
  static_assert(kWM % 16 == 0 && kWN % 16 == 0, "warp tile: m16 tiles, pairs of n8 tiles");
  static_assert(kBM * 16 % kThreads == 0 && kThreads % 16 == 0, "x chunks per thread");
  static_assert(16 * kBN % kThreads == 0 && kBN % 8 == 0, "plane chunks per thread");
};

// 128x64 / 8 warps: 1 block per SM (registers), 4 stages = 192 KB (sm_90), 3 = 144 KB (sm_80).
using CfgLarge4 = TileCfg<128, 64, 8, 1, 4, 1>;
using CfgLarge3 = TileCfg<128, 64, 8, 1, 3, 1>;
// 64x64 / 4 warps, 3 stages = 96 KB: fits sm_86/89 (99 KB) and runs 2 blocks per SM on sm_90;
// also the general (unaligned) kernel.
using CfgSmall = TileCfg<64, 64, 4, 1, 3, 2>;

struct KParams {
  const void* x;
  const void* planes;
  const void* bias;
  void* y;
  int64_t M;
  int c, d;
  int k_tiles;
  int y_vec16;  // d even and y 16-byte aligned: STG.128 per (row, o pair); FP32 y: aligned, per (row, o)
  int y_vec8;   // y 8-byte aligned: STG.64 per (row, o)
  int x_align8; // general path: x 8-byte aligned, so one channel is one 8-byte cp.async
};

// Selector: large tiles from this c (bf16's small tiles still ahead at c = 1024; docs/kernels.md,
// mma.sync forward).
template <class T> constexpr int kLargeMinC = 1024;
template <> constexpr int kLargeMinC<__nv_bfloat16> = 1536;

// ---- the kernel --------------------------------------------------------------------------------
// kFast: 16-byte cp.async (c % 8 == 0, x and planes 16-byte aligned); else the general loader.
// kGelu: the epilogue stores GELU of the output (FwdParams::gelu). kF32Out: y is FP32 (FwdParams::y_f32).
template <class T, class C, bool kFast, bool kGelu, bool kF32Out = false>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
eq_linear_fwd_mma_kernel(const KParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int BM = C::kBM, BN = C::kBN, NTHR = C::kThreads, STAGES = C::kStages;
  constexpr int MT = C::kMT, NT = C::kNT;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int warp_m = warp % C::kWarpsM, warp_n = warp / C::kWarpsM;

  int64_t m_tile, n_tile;
  grouped_tile<int64_t>(static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, m_tile,
                        n_tile);
  const int64_t m0 = m_tile * BM;
  const int n0 = static_cast<int>(n_tile) * BN;
  const int64_t M = p.M;
  const int c = p.c, d = p.d;

  const uint32_t xs_base = smem_addr(smem);
  const uint32_t ps_base = xs_base + STAGES * C::kXStage;

  // ---- global -> shared loader ----
  // Fast path: per-thread row pointers and row masks are fixed; only k0 moves. Everything is
  // unrolled straight-line code so the scheduler can interleave it with the mma stream.
  constexpr int XROWS = BM * 16 / NTHR, XSTEP = NTHR / 16;  // x rows per thread, row step
  constexpr int PSTEP = NTHR / 4, PROWS = BN / PSTEP;       // plane rows per thread per plane
  static_assert(BN % PSTEP == 0 && PSTEP % 8 == 0, "plane rows: whole swizzle periods");
  const int xq = tid & 15, xr0 = tid >> 4;  // x chunk (2 channels), first row
  const int pq = tid & 3, pr0 = tid >> 2;   // plane chunk (8 channels), first row
  const T* const xg = static_cast<const T*>(p.x);
  const T* const pg = static_cast<const T*>(p.planes);
  uint32_t xmask = 0, pmask = 0;  // rows in range (M for x, d for planes)
#pragma unroll
  for (int i = 0; i < XROWS; ++i) xmask |= (m0 + xr0 + i * XSTEP < M) ? (1u << i) : 0u;
#pragma unroll
  for (int j = 0; j < PROWS; ++j) pmask |= (n0 + pr0 + j * PSTEP < d) ? (1u << j) : 0u;
  // Row pointers at k0 = 0 (only dereferenced for rows in range).
  const T* const xrow = xg + ((m0 + xr0) * static_cast<int64_t>(c) + 2 * xq) * 4;
  const T* const prow = pg + static_cast<int64_t>(n0 + pr0) * c + 8 * pq;
  const int64_t x_step = static_cast<int64_t>(XSTEP) * c * 4;
  const int64_t p_plane = static_cast<int64_t>(d) * c, p_step = static_cast<int64_t>(PSTEP) * c;
  const uint32_t x_dst = xr0 * kXRowBytes + ((xq ^ ((xr0 & 1) << 2)) << 4);
  const uint32_t p_dst = pr0 * kPRowBytes + ((pq ^ ((pr0 >> 1) & 3)) << 4);

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    const uint32_t xs = xs_base + stage * C::kXStage;
    const uint32_t ps = ps_base + stage * C::kPStage;
    if constexpr (kFast) {
      const bool xk = k0 + 2 * xq < c;  // c even: a 2-channel chunk is all in or all out
      const T* src = xrow + static_cast<int64_t>(k0) * 4;
#pragma unroll
      for (int i = 0; i < XROWS; ++i, src += x_step)
        cp_async16_zfill(xs + x_dst + i * XSTEP * kXRowBytes, src, xg,
                         xk && ((xmask >> i) & 1));
      const bool pk = k0 + 8 * pq < c;  // c % 8 == 0
#pragma unroll
      for (int pl = 0; pl < 4; ++pl)
#pragma unroll
        for (int j = 0; j < PROWS; ++j)
          cp_async16_zfill(ps + p_dst + (pl * BN + j * PSTEP) * kPRowBytes,
                           prow + pl * p_plane + j * p_step + k0, pg, pk && ((pmask >> j) & 1));
    } else {
      // Rows not 16-byte aligned. x: one channel (4 values, 8 bytes) per copy when x is 8-byte
      // aligned (rows are 8c bytes), else 2-byte loads. Zeros past the edges.
      const unsigned short* xg16 = static_cast<const unsigned short*>(p.x);
      if (p.x_align8) {
#pragma unroll 4
        for (int i = 0; i < BM * kBK / NTHR; ++i) {
          const int e = tid + i * NTHR;
          const int r = e / kBK, ch = e % kBK;
          const bool ok = m0 + r < M && k0 + ch < c;
          const unsigned short* src = ok ? xg16 + ((m0 + r) * static_cast<int64_t>(c) + k0 + ch) * 4 : xg16;
          const uint32_t dst = xs + r * kXRowBytes + (((ch >> 1) ^ ((r & 1) << 2)) << 4) + (ch & 1) * 8;
          cp_async8(dst, src, ok ? 8 : 0);
        }
      } else {
#pragma unroll 8
        for (int i = 0; i < BM * kBK * 4 / NTHR; ++i) {
          const int e = tid + i * NTHR;
          const int r = e / (kBK * 4), j = e % (kBK * 4);  // j = channel * 4 + g within the row
          const int ch = k0 + j / 4;
          unsigned short v = 0;
          if (m0 + r < M && ch < c) v = __ldg(xg16 + ((m0 + r) * static_cast<int64_t>(c) + ch) * 4 + (j & 3));
          const uint32_t dst = xs + r * kXRowBytes + (((j >> 3) ^ ((r & 1) << 2)) << 4) + (j & 7) * 2;
          asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(v));
        }
      }
      // planes: the fast path's chunks (8 channels), gathered with 2-byte loads (rows are only
      // 2-byte aligned for odd c) and written with one 16-byte store.
      const int kp = k0 + 8 * pq;
#pragma unroll
      for (int pl = 0; pl < 4; ++pl)
#pragma unroll
        for (int j = 0; j < PROWS; ++j) {
          const unsigned short* src =
              reinterpret_cast<const unsigned short*>(prow) + pl * p_plane + j * p_step + k0;
          uint32_t w[4] = {0u, 0u, 0u, 0u};
          if (((pmask >> j) & 1) && kp < c) {
            const bool full = kp + 8 <= c;
#pragma unroll
            for (int e = 0; e < 8; ++e)
              if (full || kp + e < c) w[e >> 1] |= static_cast<uint32_t>(__ldg(src + e)) << (16 * (e & 1));
          }
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                           ps + p_dst + (pl * BN + j * PSTEP) * kPRowBytes),
                       "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
        }
    }
  };

  // ---- per-lane fragment addresses (stage 0, ks 0) ----
  // A: row warp_m*WM + gid (+8 via immediate), chunk tid4 (lo k half) / tid4 + 4 (hi k half),
  // swizzled by the row parity (= gid parity).
  const uint32_t a_row = (warp_m * C::kWM + gid) * kXRowBytes;
  const uint32_t a_lo = a_row + ((tid4 ^ ((gid & 1) << 2)) << 4);
  const uint32_t a_hi = a_lo ^ 64;  // chunk ^ 4: bits above 6 of a_row are untouched
  // B: ldmatrix lane l supplies row (l >> 4) * 8 + (l & 7) of the n16 block, k chunk (l >> 3) & 1
  // (+ 2 * ks); the chunk swizzle depends only on l & 7 since the block base is a multiple of 8.
  const int b_n = ((lane >> 4) << 3) + (lane & 7);
  const int b_sw = ((lane & 7) >> 1) & 3;
  const uint32_t b_row = (warp_n * C::kWN + b_n) * kPRowBytes;
  const uint32_t b_off0 = b_row + ((((lane >> 3) & 1) ^ b_sw) << 4);
  const uint32_t b_off1 = b_row + (((((lane >> 3) & 1) | 2) ^ b_sw) << 4);

  // A fragments of one k16 step: raw x (one LDS.128 per row and k pair) -> four planes.
  auto load_a = [&](uint32_t xs, int ks, uint32_t (&fa)[MT][4][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)  // k half: regs 0/1 lo, 2/3 hi
#pragma unroll
        for (int r8 = 0; r8 < 2; ++r8) {  // rows gid, gid + 8
          const uint32_t addr = xs + (h ? a_hi : a_lo) + (mt * 16 + r8 * 8) * kXRowBytes + ks * 128;
          const int reg = 2 * h + r8;
          xform<T>(lds128(addr), fa[mt][0][reg], fa[mt][1][reg], fa[mt][2][reg], fa[mt][3][reg]);
        }
  };

  float acc[4][MT][NT][4];  // sets: 0 = a0, 1 = a2, 2 = aR, 3 = aI
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[s][i][j][r] = 0.f;

  // B fragments from ldmatrix; six mma per (m16, n8) tile. Issue order: the first aR / aI terms
  // of both n8 tiles, then a0, a2, then the second aR / aI terms, so each accumulator's two
  // dependent mma are 8 mma apart.
  auto mma_step = [&](uint32_t ps, int ks, const uint32_t (&fa)[MT][4][4]) {
    const uint32_t bb = ps + (ks ? b_off1 : b_off0);
#pragma unroll
    for (int jp = 0; jp < NT / 2; ++jp) {
      uint32_t fb[4][4];  // [P0, PR, PI, P2][b0, b1 of n8 tile 2jp, b0, b1 of tile 2jp+1]
#pragma unroll
      for (int pl = 0; pl < 4; ++pl) ldsm_x4(fb[pl], bb + (pl * BN + jp * 16) * kPRowBytes);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t af[5][4];  // F0, FR, FI, F2, -FI (sign bits of both halves flipped)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int f = 0; f < 4; ++f) af[f][r] = fa[mt][f][r];
          af[4][r] = fa[mt][2][r] ^ 0x80008000u;
        }
        // {accumulator set, A operand, B plane}: aR += FR PR, aI += FR PI, a0 += F0 P0,
        // a2 += F2 P2, aR += (-FI) PI, aI += FI PR.
        constexpr int kTerms[6][3] = {{2, 1, 1}, {3, 1, 2}, {0, 0, 0}, {1, 3, 3}, {2, 4, 2}, {3, 2, 1}};
#pragma unroll
        for (int t = 0; t < 6; ++t)
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int set = kTerms[t][0], op = kTerms[t][1], pl = kTerms[t][2];
            Elem<T>::mma(acc[set][mt][2 * jp + jj], af[op], fb[pl][2 * jj], fb[pl][2 * jj + 1]);
          }
      }
    }
  };

  // ---- main loop ----
  // Stage s holds k tile s (mod STAGES). The barrier sits before the last k16 step of a tile:
  // after it the next tile's A fragments are built and the refill of the stage freed by the
  // previous tile is issued, both overlapping that step's mma (no cold start per tile).
  const int KT = p.k_tiles;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  constexpr int KS = kBK / 16;
  static_assert(STAGES >= 3, "the refill of tile kt-1's stage runs while tile kt+1 is read");
  static_assert(KS % 2 == 0, "A double buffer parity must repeat per tile");
  uint32_t fa[2][MT][4][4];
  cp_async_wait<STAGES - 2>();
  __syncthreads();
  if (KT > 0) load_a(xs_base, 0, fa[0]);

  int rd_stage = 0, wr_stage = STAGES - 1;
  for (int kt = 0; kt < KT; ++kt) {
    const uint32_t xs = xs_base + rd_stage * C::kXStage;
    const uint32_t ps = ps_base + rd_stage * C::kPStage;
    rd_stage = (rd_stage + 1 == STAGES) ? 0 : rd_stage + 1;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (ks + 1 < KS) {
        load_a(xs, ks + 1, fa[(ks + 1) & 1]);
      } else {
        // Tile kt+1 has landed (own copies: of the STAGES-1+kt groups committed so far all but
        // the newest STAGES-3 are complete; everyone's: the barrier), and every warp is done
        // reading tile kt-1, whose stage is refilled here.
        cp_async_wait<STAGES - 3>();
        __syncthreads();
        if (kt + STAGES - 1 < KT) load_stage(wr_stage, kt + STAGES - 1);
        cp_async_commit();  // possibly empty: keeps the group count in step with kt
        wr_stage = (wr_stage + 1 == STAGES) ? 0 : wr_stage + 1;
        if (kt + 1 < KT) load_a(xs_base + rd_stage * C::kXStage, 0, fa[0]);
      }
      mma_step(ps, ks, fa[ks & 1]);
    }
  }
  cp_async_wait<0>();  // nothing real is pending; drain the empty groups before exit

  // ---- epilogue: y[m][o][0..3] from (a0, a2, aR, aI), + bias (kGelu: GELU of that) ----
  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int o = n0 + warp_n * C::kWN + nt * 8 + 2 * tid4;
    if (o >= d) continue;
    const bool o1_ok = o + 1 < d;
    float bo[2] = {0.f, 0.f};
    if (bias != nullptr) {
      bo[0] = to_float(bias[o]);
      if (o1_ok) bo[1] = to_float(bias[o + 1]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r8 = 0; r8 < 2; ++r8) {
        const int64_t row = m0 + warp_m * C::kWM + mt * 16 + r8 * 8 + gid;
        if (row >= M) continue;
        if constexpr (kF32Out) {  // one 16-byte store per channel (y_vec16: y 16-byte aligned)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            if (j == 1 && !o1_ok) break;
            const int e = 2 * r8 + j;
            const float4 r = inverse_dft4_f32<Elem<T>::kHalve>(acc[0][mt][nt][e], acc[1][mt][nt][e],
                                                               acc[2][mt][nt][e], acc[3][mt][nt][e], bo[j]);
            float* dst = static_cast<float*>(p.y) + (row * d + o + j) * 4;
            if (p.y_vec16) {
              *reinterpret_cast<float4*>(dst) = r;
            } else {
              dst[0] = r.x, dst[1] = r.y, dst[2] = r.z, dst[3] = r.w;
            }
          }
        } else {
          uint32_t out[2][2];  // [o, o+1][(y0, y1), (y2, y3)]
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int e = 2 * r8 + j;
            inverse_dft4<T>(acc[0][mt][nt][e], acc[1][mt][nt][e], acc[2][mt][nt][e], acc[3][mt][nt][e], bo[j],
                            out[j][0], out[j][1]);
            if constexpr (kGelu) {
              out[j][0] = gelu_pair<T>(out[j][0]);
              out[j][1] = gelu_pair<T>(out[j][1]);
            }
          }
          T* dst = static_cast<T*>(p.y) + (row * d + o) * 4;
          if (p.y_vec16) {  // d even, so o + 1 < d too
            *reinterpret_cast<uint4*>(dst) = make_uint4(out[0][0], out[0][1], out[1][0], out[1][1]);
          } else {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              if (j == 1 && !o1_ok) break;
              if (p.y_vec8) {
                *reinterpret_cast<uint2*>(dst + 4 * j) = make_uint2(out[j][0], out[j][1]);
              } else {
                unsigned short* ds = reinterpret_cast<unsigned short*>(dst + 4 * j);
                ds[0] = static_cast<unsigned short>(out[j][0]);
                ds[1] = static_cast<unsigned short>(out[j][0] >> 16);
                ds[2] = static_cast<unsigned short>(out[j][1]);
                ds[3] = static_cast<unsigned short>(out[j][1] >> 16);
              }
            }
          }
        }
      }
    }
  }
}

// ---- host side -----------------------------------------------------------------------------------
template <class T, class C, bool kFast>
cudaError_t launch(const KParams& kp, int64_t num_m, int64_t num_n, cudaStream_t stream, bool gelu, bool f32) {
  auto kernel = gelu  ? eq_linear_fwd_mma_kernel<T, C, kFast, true>
                : f32 ? eq_linear_fwd_mma_kernel<T, C, kFast, false, true>
                      : eq_linear_fwd_mma_kernel<T, C, kFast, false>;
  if (C::kSmem > 48 * 1024) {
    const cudaError_t e =
        set_max_dynamic_smem(kernel, C::kSmem);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(num_m), static_cast<unsigned>(num_n));
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(kp);
  return cudaGetLastError();
}

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class T>
cudaError_t eq_linear_fwd_mma(const FwdParams& p, cudaStream_t stream) {
  if ((p.gelu && p.y_f32) || p.x_parts != 1 || p.y_parts != 1) return cudaErrorNotSupported;  // (parts: Hopper only)
  if (p.M < 0 || p.c < 1 || p.d < 1) return cudaErrorInvalidValue;  // the header's contract
  if (p.M == 0) return cudaSuccess;
  if (p.c > 0x7fffffff - kBK || p.d > 0x7fffffff - 64) return cudaErrorInvalidValue;

  KParams kp;
  kp.x = p.x;
  kp.planes = p.planes;
  kp.bias = p.bias;
  kp.y = p.y;
  kp.M = p.M;
  kp.c = static_cast<int>(p.c);
  kp.d = static_cast<int>(p.d);
  kp.k_tiles = static_cast<int>(cdiv(p.c, kBK));
  const auto aligned = [](const void* q, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(q) % a == 0;
  };
  kp.y_vec16 = p.y_f32 ? aligned(p.y, 16) : (p.d % 2 == 0) && aligned(p.y, 16);
  kp.y_vec8 = aligned(p.y, 8);
  kp.x_align8 = aligned(p.x, 8);
  const bool fast = (p.c % 8 == 0) && aligned(p.x, 16) && aligned(p.planes, 16);

  int dev = 0, num_sms = 0, smem_optin = 0, smem_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (e != cudaSuccess) return e;

  const int64_t num_n_small = cdiv(p.d, CfgSmall::kBN);
  const int64_t num_m_small = cdiv(p.M, CfgSmall::kBM);
  if (num_n_small > 65535 || num_m_small > 0x7fffffff) return cudaErrorInvalidConfiguration;

  // Config choice, from timings (docs/kernels.md, mma.sync forward): two small blocks per SM hide each
  // other's pipeline fill and epilogue and win up to c = 512; the large tile wins for long K (c = 2048);
  // at c = 1024 the two are even for fp16 and the small tiles ahead in bf16.
  // Where two small blocks do not fit on an SM (sm_80: 164 KB) the large tile is used whenever
  // it fills the SMs once.
  if (fast && smem_optin >= CfgLarge3::kSmem) {
    const int64_t num_m_large = cdiv(p.M, CfgLarge3::kBM);
    const int64_t tiles_large = num_m_large * num_n_small;
    const int64_t tiles_small = num_m_small * num_n_small;
    const bool two_small = smem_sm >= 2 * (CfgSmall::kSmem + 1024);  // + per-block reserve
    const bool large = two_small ? (p.c >= kLargeMinC<T> && cdiv(tiles_large, num_sms) <=
                                                       cdiv(tiles_small, 2 * int64_t{num_sms}))
                                 : tiles_large >= num_sms;
    if (large) {
      if (smem_optin >= CfgLarge4::kSmem)
        return launch<T, CfgLarge4, true>(kp, num_m_large, num_n_small, stream, p.gelu, p.y_f32);
      return launch<T, CfgLarge3, true>(kp, num_m_large, num_n_small, stream, p.gelu, p.y_f32);
    }
  }
  if (fast) return launch<T, CfgSmall, true>(kp, num_m_small, num_n_small, stream, p.gelu, p.y_f32);
  return launch<T, CfgSmall, false>(kp, num_m_small, num_n_small, stream, p.gelu, p.y_f32);
}

}  // namespace

// The mma.sync kernel (any device of compute capability 8.0 or newer); the plan (eq_linear_plan.h) sends
// Hopper devices to the sm_90a kernel first.
cudaError_t eq_linear_fwd_fp16(const FwdParams& p, cudaStream_t stream) { return eq_linear_fwd_mma<__half>(p, stream); }

cudaError_t eq_linear_fwd_bf16(const FwdParams& p, cudaStream_t stream) {
  return eq_linear_fwd_mma<__nv_bfloat16>(p, stream);
}

}  // namespace flash_eqlinear
