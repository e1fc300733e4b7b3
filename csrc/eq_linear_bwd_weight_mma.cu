// Fused p4 EQ-Linear weight backward on tensor cores (mma.sync m16n8k16, FP32 accumulation), fp16
// and bf16 from one template; sm_80 / sm_89 / sm_90. Math and layouts: eq_linear_bwd_weight.h.
// Its launcher also runs the Hopper kernel where the plan chose it (BwdWeightParams::hopper) and the build and
// device allow it (eq_linear_bwd_weight_sm90.cu: same split plan machinery, workspace layout and reduce kernel).
//
// GEMM view: the output tile is BD output channels o x BC input channels ci, the reduction (k)
// runs over rows m. A[o][m] = the transform of grad_y (g0, gR, gI, g2), B[m][ci] = the transform
// of x (f0, fR, fI, f2); per k16 step and (m16, n8) tile six mma feed four FP32 accumulator sets:
//   P0 += g0 f0   PR += gR fR + gI fI   PI += gI fR - gR fI   P2 += g2 f2
// (-fI: the sign bits of the B fragment flipped in registers).
//
// Both operands are reduced along m, the outermost index of x and grad_y in memory, so the group
// transform is applied once per block while staging (unlike the forward, which transforms its A
// fragments in registers): each k tile (BK rows) is copied raw into per-thread landing slots with
// cp.async (16 bytes = 2 channels x 4 group values of one row), then every thread transforms the
// slots it copied itself (no barrier needed for that) in FP32, rounds once, and stores the four
// planes into the transformed tile [plane][m][channel]. Fragments come from that tile with
// ldmatrix.trans (rows = m, 16 bytes = 8 channels; the transposed distribution is exactly the mma
// A (row = o, k pair = m, m+1) and B (k pair = m, m+1, col = ci) fragment layout).
//
// Tiling: 8 warps as 4 (o) x 2 (ci), warp tile 32 x 32 (2 m16 x 4 n8 tiles, 4 sets: 128 FP32
// accumulators per thread); block tile 128 x 64, one block per SM. Per k16 step and warp: 16
// ldmatrix.x4 and 48 mma.
// Shared memory: 2 raw stages (per-thread slots) + 2 transformed tiles; BK = 32 needs 192 KB
// (sm_90), BK = 16 96 KB (sm_80 / sm_86 / sm_89).
//   transformed A  [4][BK][BD]  row m: 16-byte chunk q (8 channels) stored at chunk q ^ (m & 7)
//   transformed B  [4][BK][BC]  same swizzle
// Each 8-lane ldmatrix phase reads rows m..m+7 (m % 8 == 0) at one logical chunk, which the XOR
// spreads over 8 bank groups; the staging stores of a warp cover one whole row or a 128-byte
// half row (conflict free either way).
//
// Pipeline per k tile kt: wait for the own copies of tile kt+1; issue the cp.async of tile kt+2
// into the raw stage freed by tile kt; per k16 step, transform part of tile kt+1 into the other
// transformed tile and run the mma of tile kt (one instruction stream: the transform's ALU work
// overlaps the tensor cores); one __syncthreads.
//
// Split over M, partials, bias: as in the FP32 kernel (eq_linear_bwd_weight_split.cuh); the FP32
// partial tiles always go to the workspace and the reduce kernel scales, converts and writes
// grad_planes. grad_bias = sum over rows of g0 is summed in FP32 from the raw values while staging.
//
// fp16 range: the transforms are halved (x0+x1+x2+x3 overflows fp16 for |x| > 16384), so the
// accumulators hold 1/4 of the sums and the reduce kernel scales by 4x the header's 1/2, 1/sqrt2.
//
// Ragged edges: rows outside the block's chunk and channels >= d or >= c are zero-filled by the
// cp.async (src-size 0) and add nothing; stores are masked. Fast path: c and d even (a 2-channel
// chunk is all in or all out), one 16-byte cp.async per chunk; otherwise two 8-byte copies (one
// channel each). Both need x and grad_y 16-byte aligned (the binding copies them otherwise).

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_func_attr.cuh"
#include "eq_linear_bwd_weight.h"
#include "eq_linear_bwd_weight_sm90.h"
#include "eq_linear_bwd_weight_split.cuh"
#include "eq_linear_mma_common.cuh"
#include "eq_plane_blocks.h"
#include "eq_switches.h"

namespace flash_eqlinear {
namespace {

template <int BK_>
struct WCfg {
  static constexpr int BD = 128, BC = 64, BK = BK_;
  static constexpr int kWarpsO = 4, kWarpsC = 2;
  static constexpr int kThreads = 32 * kWarpsO * kWarpsC;
  static constexpr int kWO = BD / kWarpsO, kWC = BC / kWarpsC;  // warp tile 32 x 32
  static constexpr int kMT = kWO / 16, kNT = kWC / 8;           // m16 (o) / n8 (ci) tiles per warp
  // Staging maps: thread t copies channel pair t % (B? / 2) of rows t / (B? / 2) + i * ?RS.
  static constexpr int GRS = kThreads / (BD / 2), GL = BK / GRS;  // grad_y: rows per pass, chunks
  static constexpr int XRS = kThreads / (BC / 2), XL = BK / XRS;  // x
  static constexpr int kRawStage = (GL + XL) * kThreads * 16;     // bytes
  static constexpr int kTA = 4 * BK * BD * 2, kTB = 4 * BK * BC * 2;
  static constexpr int kSmem = 2 * kRawStage + 2 * (kTA + kTB);
  static_assert(BK % 16 == 0 && BK % GRS == 0 && BK % XRS == 0, "k tile");
  static_assert(kWO % 16 == 0 && kWC % 16 == 0, "warp tile: m16 tiles, pairs of n8 tiles");
  static_assert(BC / 8 == 8 && BD / 8 == 16, "swizzle: XOR of the row's low 3 bits into the chunk");
  static_assert(kRawStage >= kThreads * 8, "grad_bias combine reuses the raw stages");
};
using WCfg32 = WCfg<32>;  // 192 KB: sm_90
using WCfg16 = WCfg<16>;  //  96 KB: sm_80, sm_86, sm_89

struct KParams {
  const void* x;       // (M, c, 4)
  const void* gy;      // (M, d, 4)
  float* ws;           // [S][4][d][ldw] FP32 partials
  float* ws_bias;      // [S][d] or nullptr
  int64_t M;
  int64_t chunk_rows;  // multiple of BK
  int c, d, ldw;
};

template <class T, class C, bool kFast>
__global__ void __launch_bounds__(C::kThreads, 1) eq_linear_bwd_weight_mma_kernel(const KParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int BD = C::BD, BC = C::BC, BK = C::BK, NTHR = C::kThreads;
  constexpr int GRS = C::GRS, GL = C::GL, XRS = C::XRS, XL = C::XL;
  constexpr int MT = C::kMT, NT = C::kNT;
  constexpr bool kHalve = Elem<T>::kHalve;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int o0 = int(blockIdx.x) * BD, c0 = int(blockIdx.y) * BC;
  const int64_t mb = int64_t(blockIdx.z) * p.chunk_rows;  // this block's rows: [mb, me)
  const int64_t me = min(p.M, mb + p.chunk_rows);
  const int c = p.c, d = p.d;

  const uint32_t raw_base = smem_addr(smem);                // [2][GL + XL][NTHR] 16-byte slots
  const uint32_t ta_base = raw_base + 2 * C::kRawStage;     // [2][4][BK][BD]
  const uint32_t tb_base = ta_base + 2 * C::kTA;            // [2][4][BK][BC]

  // ---- staging: fixed channel pair per thread, rows advance by GRS / XRS
  const int gq = tid % (BD / 2), gr = tid / (BD / 2);
  const int xq = tid % (BC / 2), xr = tid / (BC / 2);
  const int go = o0 + 2 * gq, xc = c0 + 2 * xq;  // first channel of the pair
  const T* const gy = static_cast<const T*>(p.gy);
  const T* const x = static_cast<const T*>(p.x);
  const int64_t g_row = int64_t(d) * 4, x_row = int64_t(c) * 4;  // elements per row
  const T* const g_src0 = gy + (mb + gr) * g_row + int64_t(go) * 4;
  const T* const x_src0 = x + (mb + xr) * x_row + int64_t(xc) * 4;
  const uint32_t slot0 = raw_base + tid * 16;

  auto issue_tile = [&](int stage, int kt) {
    const int64_t r0 = int64_t(kt) * BK;  // row offset of the tile within the chunk
    const int64_t rem = me - mb - r0;     // rows of the tile in the chunk (>= 1)
    const uint32_t dst0 = slot0 + stage * C::kRawStage;
#pragma unroll
    for (int i = 0; i < GL; ++i) {
      const bool ok = gr + i * GRS < rem;
      const T* const src = g_src0 + (r0 + i * GRS) * g_row;
      const uint32_t dst = dst0 + i * NTHR * 16;
      if constexpr (kFast) {
        cp_async16_zfill(dst, src, gy, ok && go < d);
      } else {
        cp_async8(dst, ok && go < d ? src : gy, ok && go < d ? 8 : 0);
        cp_async8(dst + 8, ok && go + 1 < d ? src + 4 : gy, ok && go + 1 < d ? 8 : 0);
      }
    }
#pragma unroll
    for (int i = 0; i < XL; ++i) {
      const bool ok = xr + i * XRS < rem;
      const T* const src = x_src0 + (r0 + i * XRS) * x_row;
      const uint32_t dst = dst0 + (GL + i) * NTHR * 16;
      if constexpr (kFast) {
        cp_async16_zfill(dst, src, x, ok && xc < c);
      } else {
        cp_async8(dst, ok && xc < c ? src : x, ok && xc < c ? 8 : 0);
        cp_async8(dst + 8, ok && xc + 1 < c ? src + 4 : x, ok && xc + 1 < c ? 8 : 0);
      }
    }
    cp_async_commit();
  };

  float bsum[2] = {0.f, 0.f};  // sum over this thread's rows of g0, channels go, go + 1

  // Own slot i of raw stage `stage` -> transformed tile `buf` (the caller has waited for the copy).
  auto transform_slot = [&](int stage, int buf, int i) {
    const bool is_g = i < GL;
    const uint4 v = lds128(slot0 + stage * C::kRawStage + i * NTHR * 16);
    float f[4][2];  // [plane][channel of the pair]
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
      const float2 a = Elem<T>::unpack(ch ? v.z : v.x), b = Elem<T>::unpack(ch ? v.w : v.y);
      dft4<kHalve>(a.x, a.y, b.x, b.y, f[0][ch], f[1][ch], f[2][ch], f[3][ch]);
      if (is_g) bsum[ch] += (a.x + b.x) + (a.y + b.y);  // unhalved, FP32
    }
    // Row r, chunk (pair / 4) swizzled by r & 7, 4 bytes per pair within the chunk.
    const int r = is_g ? gr + i * GRS : xr + (i - GL) * XRS;
    const int q = is_g ? gq : xq;
    const int row_bytes = is_g ? BD * 2 : BC * 2;
    const uint32_t off = r * row_bytes + (((q >> 2) ^ (r & 7)) << 4) + (q & 3) * 4;
    const uint32_t base = is_g ? ta_base + buf * C::kTA : tb_base + buf * C::kTB;
    const uint32_t plane_bytes = is_g ? BK * BD * 2 : BK * BC * 2;
#pragma unroll
    for (int pl = 0; pl < 4; ++pl) sts32(base + pl * plane_bytes + off, Elem<T>::pack(f[pl][0], f[pl][1]));
  };

  // ---- fragment addresses (tile buffer 0, k16 step 0). ldmatrix lane l: matrix j = l / 8, row
  // rr = l % 8. A matrices: (m half, o half) = (j >> 1, j & 1) -> a0..a3; B matrices: (m half,
  // ci 8-block) = (j & 1, j >> 1) -> b0, b1 of n8 tile 2jp, b0, b1 of tile 2jp + 1.
  const int wo = warp % C::kWarpsO, wc = warp / C::kWarpsO;
  const int j8 = lane >> 3, rr = lane & 7;
  uint32_t a_off[MT], b_off[NT / 2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
    a_off[i] = ((j8 >> 1) * 8 + rr) * (BD * 2) + ((((wo * (C::kWO / 8)) + 2 * i + (j8 & 1)) ^ rr) << 4);
#pragma unroll
  for (int jp = 0; jp < NT / 2; ++jp)
    b_off[jp] = ((j8 & 1) * 8 + rr) * (BC * 2) + ((((wc * (C::kWC / 8)) + 2 * jp + (j8 >> 1)) ^ rr) << 4);

  float acc[4][MT][NT][4];  // [plane P0, PR, PI, P2][m16 tile][n8 tile][C reg]
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[s][i][j][r] = 0.f;

  auto mma_step = [&](int buf, int ks) {
    const uint32_t ta = ta_base + buf * C::kTA;
    const uint32_t tb = tb_base + buf * C::kTB;
    {
      uint32_t fa[MT][4][4];      // [m16 tile][plane g0, gR, gI, g2][reg]
      uint32_t fb[5][NT][2];      // [plane f0, fR, fI, f2, -fI][n8 tile][reg]
#pragma unroll
      for (int pl = 0; pl < 4; ++pl) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
          ldsm_x4_trans(fa[i][pl], ta + pl * (BK * BD * 2) + ks * (16 * BD * 2) + a_off[i]);
#pragma unroll
        for (int jp = 0; jp < NT / 2; ++jp) {
          uint32_t r[4];
          ldsm_x4_trans(r, tb + pl * (BK * BC * 2) + ks * (16 * BC * 2) + b_off[jp]);
          fb[pl][2 * jp][0] = r[0];
          fb[pl][2 * jp][1] = r[1];
          fb[pl][2 * jp + 1][0] = r[2];
          fb[pl][2 * jp + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        fb[4][j][0] = fb[2][j][0] ^ 0x80008000u;
        fb[4][j][1] = fb[2][j][1] ^ 0x80008000u;
      }
      // {accumulator set, A plane, B plane}: PR += gR fR, PI += gI fR, P0 += g0 f0, P2 += g2 f2,
      // PR += gI fI, PI += gR (-fI); each set's two dependent mma are 2 * MT * NT mma apart.
      constexpr int kTerms[6][3] = {{1, 1, 1}, {2, 2, 1}, {0, 0, 0}, {3, 3, 3}, {1, 2, 2}, {2, 1, 4}};
#pragma unroll
      for (int t = 0; t < 6; ++t)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            Elem<T>::mma(acc[kTerms[t][0]][i][j], fa[i][kTerms[t][1]], fb[kTerms[t][2]][j][0],
                         fb[kTerms[t][2]][j][1]);
    }
  };

  // ---- main loop (see the file comment)
  constexpr int KS = BK / 16, kSlots = GL + XL, kSlotsPerStep = kSlots / KS;
  static_assert(kSlots % KS == 0, "the transform of the next tile is spread evenly over the k16 steps");
  const int KT = int((me - mb + BK - 1) / BK);  // >= 1: the host never makes an empty chunk
  issue_tile(0, 0);
  if (KT > 1) issue_tile(1, 1);
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kSlots; ++i) transform_slot(0, 0, i);
  __syncthreads();
  for (int kt = 0; kt < KT; ++kt) {
    const int cur = kt & 1, nxt = cur ^ 1;
    const bool more = kt + 1 < KT;
    if (more) cp_async_wait<0>();  // own copies of tile kt + 1 (the only group in flight)
    // Raw stage `cur` was read back (by its own copier) when tile kt was transformed.
    if (kt + 2 < KT) issue_tile(cur, kt + 2);
    // Transform tile kt + 1 into the other tile (last read in iteration kt - 1, before its
    // barrier) interleaved with the mma of tile kt, so the ALU work overlaps the tensor cores.
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (more) {
#pragma unroll
        for (int i = ks * kSlotsPerStep; i < (ks + 1) * kSlotsPerStep; ++i) transform_slot(nxt, nxt, i);
      }
      mma_step(cur, ks);
    }
    if (more) __syncthreads();
  }

  // ---- epilogue: FP32 partials, one float2 (ci, ci + 1) per (plane, o); ldw % 4 == 0 and ci even,
  // so ci < c implies ci + 1 < ldw.
  const int gid = lane >> 2, tid4 = lane & 3;
  float* const ws = p.ws + int64_t(blockIdx.z) * 4 * d * p.ldw;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int ci = c0 + wc * C::kWC + j * 8 + 2 * tid4;
      if (ci >= c) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int o = o0 + wo * C::kWO + i * 16 + h * 8 + gid;
        if (o >= d) continue;
#pragma unroll
        for (int pl = 0; pl < 4; ++pl)
          *reinterpret_cast<float2*>(ws + (int64_t(pl) * d + o) * p.ldw + ci) =
              make_float2(acc[pl][i][j][2 * h], acc[pl][i][j][2 * h + 1]);
      }
    }

  // ---- grad_bias partial: the blocks of the first c-tile column combine the GRS per-thread sums
  // of each channel pair in a fixed order (block-uniform condition, so the barrier is safe). The
  // raw stages are free: every copy has landed and every thread is past its last read-back.
  if (p.ws_bias != nullptr && blockIdx.y == 0) {
    float* const red = reinterpret_cast<float*>(smem);  // [NTHR][2]
    __syncthreads();
    red[2 * tid] = bsum[0];
    red[2 * tid + 1] = bsum[1];
    __syncthreads();
    if (tid < BD) {  // channel o0 + tid = pair tid / 2, element tid % 2
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < GRS; ++j) s += red[2 * (tid / 2 + j * (BD / 2)) + (tid & 1)];
      if (o0 + tid < d) p.ws_bias[int64_t(blockIdx.z) * d + o0 + tid] = s;
    }
  }
}

// ---- host side -----------------------------------------------------------------------------------
using split::cdiv;

// Cost models for the split plan: 1024 FP16 MAC / SM / cycle (sm_90 dense) at an assumed 35% for
// mma.sync with the staging overhead; one model per k-tile height, picked by shared memory.
constexpr split::TileModel kModel32{WCfg32::BD, WCfg32::BC, WCfg32::BK, 1, WCfg32::kThreads,
                                    1024.0 * 0.35, 6000.0, true};
constexpr split::TileModel kModel16{WCfg16::BD, WCfg16::BC, WCfg16::BK, 1, WCfg16::kThreads,
                                    1024.0 * 0.3, 6000.0, true};

bool sizes_ok(int64_t M, int64_t c, int64_t d) {
  return M >= 0 && c >= 1 && d >= 1 && c <= INT_MAX / 4 - 1024 && d <= INT_MAX / 4 - 1024 &&
         M / 16 < INT_MAX;
}

struct DeviceInfo {
  int sms = 0, smem_optin = 0;
};

cudaError_t device_info(int device, DeviceInfo& info) {
  cudaError_t e = cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return e;
}

bool use_bk32(const DeviceInfo& info) { return info.smem_optin >= WCfg32::kSmem; }

// A half-width last o tile's time per row against a full tile's (split_last_tile). FLASH_EQLINEAR_DEBUG wgrad_half_r
// overrides it (read at each call; for tuning). The half tile takes more than 0.7 of a full one's time: at 0.7 and
// below ViT-B's proj ran slower than with the uniform plan, at 0.85 not, while qkv gained at 0.5 .. 0.85
// (measurements: docs/kernels.md, Weight gradient split plan).
double half_tile_time() {
  const char* v = debug_switch("wgrad_half_r");
  return v != nullptr ? std::atof(v) : 0.85;
}

// The kernel (the Hopper one where the plan chose it and it can run, else mma.sync) and its split plan; the
// workspace query and the launch make the same choice.
struct Choice {
  split::Plan plan;
  bool sm90 = false;
  bool swap = false;       // the Hopper kernel with x as the A operand
  int64_t bias_parts = 1;  // bias partials per row chunk
};

Choice choose(int64_t M, int64_t c, int64_t d, const DeviceInfo& info, int dev, bool hopper) {
  Choice ch;
  ch.sm90 = hopper && eq_bwd_weight_sm90_eligible(M, c, d, dev);
  ch.swap = ch.sm90 && eq_bwd_weight_sm90_swap(c, d);
  const split::TileModel* model = ch.sm90 ? &kBwdWeightSm90Model : use_bk32(info) ? &kModel32 : &kModel16;
  // The plan counts tiles as (d / BD) x (c / BC): with swapped roles the A side is c
  ch.plan = ch.swap ? split::make_plan(M, d, c, info.sms, model, 1) : split::make_plan(M, c, d, info.sms, model, 1);
  if (ch.sm90) ch.bias_parts = eq_bwd_weight_sm90_bias_parts(c, ch.swap);
  // The Hopper kernel's last o tile of 64 channels or fewer: fewer, longer row chunks there (split_last_tile).
  const int64_t BD = kBwdWeightSm90Model.BD, BC = kBwdWeightSm90Model.BC;
  if (ch.sm90 && !ch.swap && d % BD != 0 && d % BD <= BD / 2)
    split::split_last_tile(ch.plan, M, kBwdWeightSm90Model.BK, (d + BD - 1) / BD, (c + BC - 1) / BC,
                           int64_t(info.sms) * kBwdWeightSm90Model.blocks_per_sm, half_tile_time());
  return ch;
}

template <class T, class C, bool kFast>
cudaError_t launch(const KParams& kp, const split::Plan& plan, cudaStream_t stream) {
  auto* kernel = eq_linear_bwd_weight_mma_kernel<T, C, kFast>;
  const cudaError_t e = set_max_dynamic_smem(kernel, C::kSmem);
  if (e != cudaSuccess) return e;
  const int64_t grid_d = cdiv(kp.d, C::BD), grid_c = cdiv(kp.c, C::BC);
  if (grid_d > INT_MAX || grid_c > 65535 || plan.S > 65535) return cudaErrorInvalidConfiguration;
  kernel<<<dim3(unsigned(grid_d), unsigned(grid_c), unsigned(plan.S)), C::kThreads, C::kSmem, stream>>>(kp);
  return cudaGetLastError();
}

template <class T>
cudaError_t bwd_weight_mma(const BwdWeightParams& p, cudaStream_t stream) {
  if (!sizes_ok(p.M, p.c, p.d) || p.grad_planes == nullptr) return cudaErrorInvalidValue;
  T* const out = static_cast<T*>(p.grad_planes);
  T* const out_bias = static_cast<T*>(p.grad_bias);
  if (p.M == 0) {  // a sum over no rows: +0 in every format
    cudaError_t err = cudaMemsetAsync(out, 0, size_t(4 * p.d * p.c) * sizeof(T), stream);
    if (err == cudaSuccess && out_bias != nullptr) err = cudaMemsetAsync(out_bias, 0, size_t(p.d) * sizeof(T), stream);
    if (err == cudaSuccess && p.adj != nullptr && p.planes != nullptr)
      err = eq_adjoint_planes(p.planes, p.adj, p.d, p.c, int(sizeof(T)), stream);
    return err;
  }
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.x == nullptr || p.gy == nullptr || !aligned16(p.x) || !aligned16(p.gy)) return cudaErrorInvalidValue;

  int dev = 0;
  DeviceInfo info;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = device_info(dev, info);
  if (err != cudaSuccess) return err;
  const Choice ch = choose(p.M, p.c, p.d, info, dev, p.hopper);
  const split::Plan& plan = ch.plan;
  if (plan.S < 1) return cudaErrorInvalidConfiguration;
  if (p.gy_parts != 1) {  // grad_y in parts: the Hopper kernel only, each part whole TMA boxes
    const bool ok = ch.sm90 && (p.gy_parts == 2 || p.gy_parts == 3) &&
                    p.d % (p.gy_parts * eq_bwd_weight_sm90_gy_part_unit(ch.swap)) == 0 && aligned16(p.gy1) &&
                    (p.gy_parts == 2 || aligned16(p.gy2));
    if (!ok) return cudaErrorNotSupported;
  }
  const size_t need = split::workspace_bytes(plan, true, p.c, p.d, ch.bias_parts);
  if (p.workspace == nullptr || p.workspace_bytes < need || !aligned16(p.workspace)) return cudaErrorInvalidValue;

  KParams kp;
  kp.x = p.x;
  kp.gy = p.gy;
  kp.M = p.M;
  kp.chunk_rows = plan.chunk_rows;
  kp.c = int(p.c);
  kp.d = int(p.d);
  kp.ldw = int(split::round_up4(p.c));
  kp.ws = static_cast<float*>(p.workspace);
  float* const ws_bias = kp.ws + int64_t(plan.S) * 4 * kp.d * kp.ldw;
  kp.ws_bias = out_bias != nullptr ? ws_bias : nullptr;

  const bool fast = p.c % 2 == 0 && p.d % 2 == 0;
  if (ch.sm90) {
    const BwdWeightSm90Args a{p.x,    p.gy,        kp.ws,  kp.ws_bias,           p.M,        plan.chunk_rows,
                              kp.c,   kp.d,        kp.ldw, plan.S,               ch.swap,    plan.S_last,
                              plan.chunk_rows_last, p.gy_parts, {p.gy1, p.gy2}};
    err = std::is_same_v<T, __half> ? eq_bwd_weight_sm90_fp16(a, stream) : eq_bwd_weight_sm90_bf16(a, stream);
  } else if (use_bk32(info))
    err = fast ? launch<T, WCfg32, true>(kp, plan, stream) : launch<T, WCfg32, false>(kp, plan, stream);
  else
    err = fast ? launch<T, WCfg16, true>(kp, plan, stream) : launch<T, WCfg16, false>(kp, plan, stream);
  if (err != cudaSuccess) return err;
  // Halved fp16 transforms: the accumulators hold 1/4 of the sums.
  const float k = Elem<T>::kHalve ? 4.f : 1.f;
  split::AdjointJob job;
  if (p.planes != nullptr && p.adj != nullptr) job = {p.planes, p.adj};
  split::LastTile last;
  if (plan.S_last > 0)
    last = {int((p.d - 1) / kBwdWeightSm90Model.BD * kBwdWeightSm90Model.BD), plan.S_last,
            int(plan.S_last * ch.bias_parts)};
  return split::launch_reduce<T>(kp.ws, ws_bias, out, out_bias, plan.S, kp.c, kp.d, kp.ldw, 0.5f * k,
                                 0.70710678118654752f * k, info.sms, stream, int(plan.S * ch.bias_parts), job,
                                 last);
}

}  // namespace

size_t eq_linear_bwd_weight_workspace_bytes(int64_t M, int64_t c, int64_t d, int elem_bytes, int device,
                                            bool hopper) {
  DeviceInfo info;
  if (M <= 0 || !sizes_ok(M, c, d) || device_info(device, info) != cudaSuccess) return 0;
  if (elem_bytes == 4) return eq_linear_bwd_weight_fp32_workspace_bytes(M, c, d, info.sms);
  const Choice ch = choose(M, c, d, info, device, hopper);
  return split::workspace_bytes(ch.plan, true, c, d, ch.bias_parts);
}

cudaError_t eq_linear_bwd_weight_fp16(const BwdWeightParams& p, cudaStream_t stream) {
  return bwd_weight_mma<__half>(p, stream);
}

cudaError_t eq_linear_bwd_weight_bf16(const BwdWeightParams& p, cudaStream_t stream) {
  return bwd_weight_mma<__nv_bfloat16>(p, stream);
}

}  // namespace flash_eqlinear
