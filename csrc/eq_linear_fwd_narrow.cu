// Fused p4 EQ-Linear forward for narrow layers (c, d <= 32), any element type: see eq_linear_fwd.h for
// the math and eq_linear_fwd_narrow.h for when it runs.
//
// Why a separate kernel: at c = d = 16 a layer does 6 * 16 * 16 = 1536 MACs per row against 128 (fp32)
// or 64 (fp16) bytes of x and y: a streaming pass. The tiled kernels pay per-tile fixed costs
// (pipeline fill over k tiles, 64 output channels per tile of which d = 16 uses a quarter, a 128-row
// SIMT tile whose math is short next to its load latency) that dominate there.
//
// Persistent blocks of 4 warps; each warp walks warp tiles of WR rows x all d output channels x the
// whole K = c on its own (one block-wide barrier, after the planes copy), so one warp's math overlaps
// other warps' loads and stores, and the next tile's rows load during this tile's math:
//   0. The block copies the planes to shared memory as FP32 [g][k][o] (zero-padded to KC x DN).
//   1. The warp's x rows arrive by cp.async in lane-private 16-byte slots (consecutive lanes copy
//      consecutive chunks of a row: coalesced); each lane stores the group DFT of its quadruples
//      (row, channel) as FP32 [g][k][row] (k-major: the math reads 4 consecutive rows as a float4),
//      then issues the copies of the warp's next tile into the freed slots.
//   2. A lane owns 4 rows x 2 output channels: per k, 4 LDS.128 (f0, fR, fI, f2 of its rows) and
//      4 LDS.64 (P0, PR, PI, P2 of its channels) feed 48 FFMA into a0, a2, aR, aI. (KC = DN = 64,
//      exact FP32 only: 4 channels, LDS.128 of the planes, 96 FFMA.)
//   3. Inverse DFT + bias in registers; the channels x 4 group values of a row are contiguous in
//      y, so a lane stores 32 (fp32) or 16 (fp16 / bf16) bytes per row and channel pair, and the
//      NX lanes of a row cover it contiguously.
// Arithmetic is FP32 for every element type (the products are exact FP32 FFMA: this is also the
// exact-FP32 path, whatever the TF32 switch says). Unaligned x / y, rows that are not whole 16-byte
// chunks or odd d take the element path (plain loads at the top of each tile, element stores).
// fp16 / bf16 layers with c and d even and 16-byte aligned x / y take the mma.sync variant further
// down instead (same walk; the FFMA math was what set their pace).
//
// Ragged edges: rows >= M and channels >= c are zero in shared memory and never stored; output
// channels >= d read zero planes and are not stored. Row offsets are 64-bit.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_func_attr.cuh"
#include "eq_linear_fwd.h"
#include "eq_linear_fwd_narrow.h"
#include "eq_linear_mma_common.cuh"
#include "eq_pdl.cuh"
#include "eq_switches.h"

namespace flash_eqlinear {
namespace {

constexpr int kThreads = 128;
// Blocks per SM the grid is sized for; each warp walks several tiles when M is large. FP32: 2 blocks
// (8 warps per SM) measured faster than 4 at c, d = 16 .. 32 (docs/kernels.md, Narrow forward).
// KC = 64 (exact FP32 only, c in 33 .. 64) takes 194-224 KB of shared memory per block: one block
// of 8 warps per SM instead.
constexpr int kBlocksPerSm = 2;

// KC, DN: c and d rounded up (16, 32, or for exact FP32 64). kVec: x and y 16-byte aligned, rows of x
// a whole number of 16-byte chunks, d even (16-byte stores of an output-channel pair); otherwise
// element accesses.
template <class T, int KC, int DN>
struct NarrowCfg {
  static constexpr int kThreads = KC > 32 ? 2 * flash_eqlinear::kThreads : flash_eqlinear::kThreads;
  static constexpr int kMinBlocks = KC > 32 ? 1 : kBlocksPerSm;  // resident blocks (launch bounds)
  static constexpr int kWarps = kThreads / 32;
  // Output channels per lane: 2, or 4 for KC = DN = 64 (half the shared-memory wavefronts per FFMA,
  // which would otherwise bind there: a float4 of planes per k serves 4 channels).
  static constexpr int CPL = KC > 32 && DN > 32 ? 4 : 2;
  static constexpr int NX = DN / CPL;           // lanes along output channels
  static constexpr int WR = 4 * (32 / NX);      // rows per warp (4 per lane): 16 for DN = 16, 8 for 32
  static constexpr int BM = kWarps * WR;        // rows per block
  static constexpr int SA = WR + 4;             // f row stride: float4-aligned, spreads k over banks
  static constexpr int QPC = 16 / (4 * int(sizeof(T)));  // (row, channel) quadruples per 16 bytes
  static constexpr int CPR = KC / QPC;          // 16-byte chunks per row of a full-width tile
  static constexpr int kLoads = WR * CPR / 32;  // chunks per lane
  static constexpr int kQuads = WR * KC / 32;   // quadruples per lane (element-access path)
  // Plane row stride: float2-aligned, the transposed stores (consecutive k per lane) 2-way, not
  // 32-way; with CPL = 4 float4-aligned and unpadded (the 8-warp KC = 64 block needs the space;
  // the one-time copy takes the conflicts).
  static constexpr int SP = CPL == 4 ? DN : DN + 2;
  static constexpr int kPlaneLoads = 4 * KC * DN / kThreads;  // plane elements per thread
  static constexpr int kWarpF = 4 * KC * SA;    // floats of one warp's f tile
  static constexpr int kWarpRaw = 16 * kLoads * 32;  // bytes of one warp's cp.async slots
  static constexpr int kSmemBytes = kWarps * (kWarpF * int(sizeof(float)) + kWarpRaw) + 4 * KC * SP * int(sizeof(float));
  static_assert(WR * CPR % 32 == 0 && WR * KC % 32 == 0, "x rows split evenly over the lanes");
  static_assert(QPC >= 1, "16-byte chunks hold whole quadruples");
  static_assert(4 * KC * DN % kThreads == 0, "plane elements split evenly over the threads");
};

template <class T, int KC, int DN, bool kVec>
__global__ void __launch_bounds__((NarrowCfg<T, KC, DN>::kThreads), (NarrowCfg<T, KC, DN>::kMinBlocks))
eq_linear_fwd_narrow_kernel(const T* __restrict__ x, const T* __restrict__ planes, const T* __restrict__ bias,
                            T* __restrict__ y, int64_t M, int c, int d) {
  using Cfg = NarrowCfg<T, KC, DN>;
  constexpr int WR = Cfg::WR, SA = Cfg::SA, SP = Cfg::SP, QPC = Cfg::QPC, CPR = Cfg::CPR, NX = Cfg::NX;
  extern __shared__ float4 smem4[];
  pdl_wait();  // eq_pdl.cuh: no global memory is touched before this
  float* const P = reinterpret_cast<float*>(smem4);                      // [4][KC][SP]: P0, PR, PI, P2
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* const F = P + 4 * KC * SP + warp * (Cfg::kWarpF + Cfg::kWarpRaw / 4);  // warp's [4][KC][SA], then raw
  // Warp tiles (WR rows each) in a grid-stride loop: warp w of block b takes tiles b * kWarps + w,
  // then + the number of warps in the grid.
  const int64_t num_tiles = (M + WR - 1) / WR, stride = int64_t(gridDim.x) * Cfg::kWarps;
  int64_t tile = int64_t(blockIdx.x) * Cfg::kWarps + warp;

  // Stores the group DFT of the quadruple (row r, channel k) of the warp's tile.
  const auto put_f = [&](int r, int k, float x0, float x1, float x2, float x3) {
    float* const f = F + k * SA + r;
    dft4<false>(x0, x1, x2, x3, f[0 * KC * SA], f[1 * KC * SA], f[2 * KC * SA], f[3 * KC * SA]);
  };

  // One warp tile's x rows. Chunk i = lane + 32 * it is row i / CPR, channels (i % CPR) * QPC ..;
  // chunks past c or M are zero. 16-byte path: cp.async into lane-private slots raw[it][lane] (the
  // next tile's copies fly during this tile's math without holding registers; a lane reads back only
  // its own slots, so its wait_group suffices). Element path: one quadruple (row, channel) per
  // register group, loaded at the top of each tile.
  uint4* const raw = reinterpret_cast<uint4*>(F + Cfg::kWarpF) + lane;
  const auto issue_x = [&](int64_t m0) {
    const int cpr = c / QPC;  // valid chunks per row (c % QPC == 0 on this path)
    const T* const xt = x + m0 * c * 4;
    #pragma unroll
    for (int it = 0; it < Cfg::kLoads; ++it) {
      const int i = lane + 32 * it, r = i / CPR, q = i % CPR;
      cp_async16_zfill(smem_addr(raw + 32 * it), xt + (r * c + q * QPC) * 4, x, m0 + r < M && q < cpr);
    }
    cp_async_commit();
  };
  if (kVec && tile < num_tiles) issue_x(tile * WR);  // in flight during the planes copy and the barrier

  // ---- planes (4, d, c) -> P[g][k][o] (the F groups' order P0, PR, PI, P2 is the planes' order):
  // all loads first (a loop of load-then-store would wait out one L2 latency per iteration).
  float pv[Cfg::kPlaneLoads];
  #pragma unroll
  for (int it = 0; it < Cfg::kPlaneLoads; ++it) {
    const int i = tid + Cfg::kThreads * it, g = i / (DN * KC), o = (i / KC) % DN, k = i % KC;
    pv[it] = (o < d && k < c) ? to_float(planes[(int64_t(g) * d + o) * c + k]) : 0.f;
  }
  #pragma unroll
  for (int it = 0; it < Cfg::kPlaneLoads; ++it) {
    const int i = tid + Cfg::kThreads * it, g = i / (DN * KC), o = (i / KC) % DN, k = i % KC;
    P[(g * KC + k) * SP + o] = pv[it];
  }
  __syncthreads();

  constexpr int CPL = Cfg::CPL;
  const int r0 = 4 * (lane / NX), o0 = CPL * (lane % NX);  // this lane's rows and output channels
  float bv[CPL];
  #pragma unroll
  for (int j = 0; j < CPL; ++j) bv[j] = (bias != nullptr && o0 + j < d) ? to_float(bias[o0 + j]) : 0.f;

  for (; tile < num_tiles; tile += stride) {
    const int64_t m0 = tile * WR;
    if constexpr (kVec) {
      cp_async_wait<0>();
      #pragma unroll
      for (int it = 0; it < Cfg::kLoads; ++it) {
        const int i = lane + 32 * it;
        const uint4 u = raw[32 * it];
        const T* e = reinterpret_cast<const T*>(&u);
        #pragma unroll
        for (int j = 0; j < QPC; ++j)
          put_f(i / CPR, (i % CPR) * QPC + j, to_float(e[4 * j]), to_float(e[4 * j + 1]),
                to_float(e[4 * j + 2]), to_float(e[4 * j + 3]));
      }
      if (tile + stride < num_tiles) issue_x((tile + stride) * WR);  // slots read: refill them
    } else {
      float4 q[Cfg::kQuads];
      #pragma unroll
      for (int it = 0; it < Cfg::kQuads; ++it) {
        const int i = lane + 32 * it, k = i % KC;
        const int64_t m = m0 + i / KC;
        q[it] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (m < M && k < c) {
          const T* src = x + (m * c + k) * 4;
          q[it] = make_float4(to_float(src[0]), to_float(src[1]), to_float(src[2]),
                              to_float(src[3]));
        }
      }
      #pragma unroll
      for (int it = 0; it < Cfg::kQuads; ++it) {
        const int i = lane + 32 * it;
        put_f(i / KC, i % KC, q[it].x, q[it].y, q[it].z, q[it].w);
      }
    }
    __syncwarp();

    // ---- six products: rows r0 .. r0 + 3 of the warp's tile, output channels o0 .. o0 + CPL - 1.
    float a0[4][CPL] = {}, a2[4][CPL] = {}, aR[4][CPL] = {}, aI[4][CPL] = {};
    #pragma unroll 4  // full unrolling hoists loads of many k steps: registers, spills
    for (int k = 0; k < KC; ++k) {
      float f[4][4], p[4][CPL];
      #pragma unroll
      for (int g = 0; g < 4; ++g) {
        const float4 fv = *reinterpret_cast<const float4*>(F + (g * KC + k) * SA + r0);
        f[g][0] = fv.x; f[g][1] = fv.y; f[g][2] = fv.z; f[g][3] = fv.w;
        if constexpr (CPL == 4) {
          const float4 pp = *reinterpret_cast<const float4*>(P + (g * KC + k) * SP + o0);
          p[g][0] = pp.x; p[g][1] = pp.y; p[g][2] = pp.z; p[g][3] = pp.w;
        } else {
          const float2 pp = *reinterpret_cast<const float2*>(P + (g * KC + k) * SP + o0);
          p[g][0] = pp.x; p[g][1] = pp.y;
        }
      }
      #pragma unroll
      for (int i = 0; i < 4; ++i) {
        #pragma unroll
        for (int j = 0; j < CPL; ++j) {
          a0[i][j] = fmaf(f[0][i], p[0][j], a0[i][j]);
          aR[i][j] = fmaf(f[1][i], p[1][j], aR[i][j]);
          aR[i][j] = fmaf(-f[2][i], p[2][j], aR[i][j]);
          aI[i][j] = fmaf(f[1][i], p[2][j], aI[i][j]);
          aI[i][j] = fmaf(f[2][i], p[1][j], aI[i][j]);
          a2[i][j] = fmaf(f[3][i], p[3][j], a2[i][j]);
        }
      }
    }
    __syncwarp();  // every lane has read F before the next tile's transform overwrites it

    // ---- inverse DFT + bias, stores
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + r0 + i;
      if (m >= M) break;
      float out[CPL][4];
      #pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const float4 v = inverse_dft4_f32(a0[i][j], a2[i][j], aR[i][j], aI[i][j], bv[j]);
        out[j][0] = v.x; out[j][1] = v.y; out[j][2] = v.z; out[j][3] = v.w;
      }
      T* const dst = y + (m * d + o0) * 4;
      if constexpr (kVec) {
        #pragma unroll
        for (int j = 0; j < CPL; j += 2) {  // channel pairs: d even, so o0 + j < d implies o0 + j + 1 < d
          if (o0 + j >= d) break;
          if constexpr (sizeof(T) == 4) {
            reinterpret_cast<float4*>(dst)[j] = make_float4(out[j][0], out[j][1], out[j][2], out[j][3]);
            reinterpret_cast<float4*>(dst)[j + 1] =
                make_float4(out[j + 1][0], out[j + 1][1], out[j + 1][2], out[j + 1][3]);
          } else {
            uint4 packed;
            T* const e = reinterpret_cast<T*>(&packed);
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
              #pragma unroll
              for (int g = 0; g < 4; ++g) e[4 * h + g] = from_float<T>(out[j + h][g]);
            }
            reinterpret_cast<uint4*>(dst)[j / 2] = packed;
          }
        }
      } else {
        #pragma unroll
        for (int j = 0; j < CPL; ++j) {
          if (o0 + j >= d) break;
          #pragma unroll
          for (int g = 0; g < 4; ++g) dst[4 * j + g] = from_float<T>(out[j][g]);
        }
      }
    }
  }
}

// ---- fp16 / bf16 with d <= 32: the products on mma.sync m16n8k16 (FP32 accumulation). A warp tile is
// 16 rows = one m16 block; the A fragments come straight from the raw rows through xform (the group
// DFT in FP32, rounded once to the element type, halved for fp16's range, as in the tiled kernels);
// the B fragments (NT = DN / 8 n8 tiles x 4 planes x KC / 16 k steps) stay in registers for the whole
// kernel, so there is no shared-memory copy of the planes and no block barrier. Lane (gid, t) owns rows
// gid, gid + 8 and output channels 8 j + 2t, 8 j + 2t + 1 (j < NT); the epilogue stores 16 bytes per
// (row, channel pair). Needs c and d even, x and y 16-byte aligned, planes 4-byte aligned.
template <class T, int KC, int DN>
struct NarrowMmaCfg {
  static constexpr int NT = DN / 8;                // n8 tiles
  // Resident blocks per SM the grid is sized for (<= 16 KB of shared memory each; registers by the
  // launch bounds). fp16: d = 16 ran faster with 4 blocks than with 2, d = 24 .. 32 slower
  // (docs/kernels.md, Narrow forward).
  static constexpr int kBlocks = DN == 16 ? 4 : 2;
  static constexpr int WR = 16;                    // rows per warp tile
  static constexpr int CPR = KC / 2;               // 16-byte chunks (2 channels) per row
  static constexpr int KS = KC / 16;               // k16 steps
  static constexpr int kLoads = WR * CPR / 32;     // chunks per lane
  static constexpr int kSmemBytes = kThreads / 32 * WR * CPR * 16;
};

template <class T, int KC, int DN>
__global__ void __launch_bounds__(kThreads, (NarrowMmaCfg<T, KC, DN>::kBlocks))
eq_linear_fwd_narrow_mma_kernel(const T* __restrict__ x, const T* __restrict__ planes, const T* __restrict__ bias,
                                T* __restrict__ y, int64_t M, int c, int d) {
  using Cfg = NarrowMmaCfg<T, KC, DN>;
  constexpr int WR = Cfg::WR, CPR = Cfg::CPR, KS = Cfg::KS, NT = Cfg::NT, kWarps = kThreads / 32;
  extern __shared__ uint4 slots[];
  pdl_wait();  // eq_pdl.cuh: no global memory is touched before this
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, t = lane % 4;
  uint4* const raw = slots + warp * WR * CPR;  // the warp's rows as 16-byte chunks [r][q]
  const int64_t num_tiles = (M + WR - 1) / WR, stride = int64_t(gridDim.x) * kWarps;
  int64_t tile = int64_t(blockIdx.x) * kWarps + warp;
  const int cpr = c / 2;  // valid chunks per row

  const auto issue_x = [&](int64_t m0) {
    const T* const xt = x + m0 * c * 4;
    #pragma unroll
    for (int it = 0; it < Cfg::kLoads; ++it) {
      const int i = lane + 32 * it, r = i / CPR, q = i % CPR;
      cp_async16_zfill(smem_addr(raw + i), xt + (r * c + q * 2) * 4, x, m0 + r < M && q < cpr);
    }
    cp_async_commit();
  };
  if (tile < num_tiles) issue_x(tile * WR);

  // B fragments: plane g, n tile j, k step s, half h: channels k = 16 s + 8 h + 2t, + 1 of output
  // channel 8 j + gid (zero past c or d).
  uint32_t b[KS][NT][4][2];
  #pragma unroll
  for (int s = 0; s < KS; ++s) {
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
      #pragma unroll
      for (int g = 0; g < 4; ++g) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int o = 8 * j + gid, k = 16 * s + 8 * h + 2 * t;
          b[s][j][g][h] = (o < d && k < c)
              ? __ldg(reinterpret_cast<const uint32_t*>(planes + (int64_t(g) * d + o) * c + k)) : 0u;
        }
      }
    }
  }
  float bv[NT][2];
  #pragma unroll
  for (int j = 0; j < NT; ++j) {
    #pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int o = 8 * j + 2 * t + e;
      bv[j][e] = (bias != nullptr && o < d) ? to_float(bias[o]) : 0.f;
    }
  }

  for (; tile < num_tiles; tile += stride) {
    const int64_t m0 = tile * WR;
    cp_async_wait<0>();
    __syncwarp();  // the chunks the other lanes copied are visible
    // A registers [k step][F0, FR, FI, F2][e]: e = 0..3 are (row gid | gid + 8) x (k 2t | 2t + 8).
    uint32_t A[KS][4][4];
    #pragma unroll
    for (int s = 0; s < KS; ++s) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint4 v = raw[(gid + 8 * (e & 1)) * CPR + 8 * s + 4 * (e >> 1) + t];
        xform<T>(v, A[s][0][e], A[s][1][e], A[s][2][e], A[s][3][e]);
      }
    }
    __syncwarp();  // every lane has read the slots before they are refilled
    if (tile + stride < num_tiles) issue_x((tile + stride) * WR);

    float acc[4][NT][4] = {};  // [a0, a2, aR, aI][n tile][C register]
    #pragma unroll
    for (int s = 0; s < KS; ++s) {
      uint32_t nfi[4];  // -FI: the sign bit of both packed halves
      #pragma unroll
      for (int e = 0; e < 4; ++e) nfi[e] = A[s][2][e] ^ 0x80008000u;
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        const auto& P = b[s][j];  // P0, PR, PI, P2
        Elem<T>::mma(acc[0][j], A[s][0], P[0][0], P[0][1]);  // a0 += F0 P0
        Elem<T>::mma(acc[1][j], A[s][3], P[3][0], P[3][1]);  // a2 += F2 P2
        Elem<T>::mma(acc[2][j], A[s][1], P[1][0], P[1][1]);  // aR += FR PR
        Elem<T>::mma(acc[2][j], nfi, P[2][0], P[2][1]);      // aR -= FI PI
        Elem<T>::mma(acc[3][j], A[s][1], P[2][0], P[2][1]);  // aI += FR PI
        Elem<T>::mma(acc[3][j], A[s][2], P[1][0], P[1][1]);  // aI += FI PR
      }
    }
    // C registers 2 rr + e: row gid + 8 rr, output channel 8 j + 2t + e.
    #pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t m = m0 + gid + 8 * rr;
      if (m >= M) continue;
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int o = 8 * j + 2 * t;
        if (o >= d) continue;  // d even: o < d implies o + 1 < d
        uint4 out;
        const int q0 = 2 * rr, q1 = 2 * rr + 1;
        inverse_dft4<T>(acc[0][j][q0], acc[1][j][q0], acc[2][j][q0], acc[3][j][q0], bv[j][0], out.x, out.y);
        inverse_dft4<T>(acc[0][j][q1], acc[1][j][q1], acc[2][j][q1], acc[3][j][q1], bv[j][1], out.z, out.w);
        *reinterpret_cast<uint4*>(y + (m * d + o) * 4) = out;
      }
    }
  }
}

// An attribute of the current device.
cudaError_t device_attribute(cudaDeviceAttr attr, int& value) {
  int dev = 0;
  const cudaError_t err = cudaGetDevice(&dev);
  return err == cudaSuccess ? cudaDeviceGetAttribute(&value, attr, dev) : err;
}

template <class T, int KC, int DN>
cudaError_t launch_mma(const FwdParams& p, int sms, cudaStream_t stream) {
  using Cfg = NarrowMmaCfg<T, KC, DN>;
  constexpr int kRowsPerBlock = Cfg::WR * (kThreads / 32);
  const int64_t blocks = std::min<int64_t>((p.M + kRowsPerBlock - 1) / kRowsPerBlock, sms * int64_t(Cfg::kBlocks));
  return launch_maybe_pdl(dim3(unsigned(blocks)), dim3(kThreads), Cfg::kSmemBytes, stream,
                          eq_linear_fwd_narrow_mma_kernel<T, KC, DN>, static_cast<const T*>(p.x),
                          static_cast<const T*>(p.planes), static_cast<const T*>(p.bias), static_cast<T*>(p.y), p.M,
                          int(p.c), int(p.d));
}

template <class T, int KC, int DN, bool kVec>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
  using Cfg = NarrowCfg<T, KC, DN>;
  auto* kernel = eq_linear_fwd_narrow_kernel<T, KC, DN, kVec>;
  if (Cfg::kSmemBytes > 48 * 1024) {
    const cudaError_t err = set_max_dynamic_smem(kernel, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  int sms = 0, smem_sm = 0;
  cudaError_t err = device_attribute(cudaDevAttrMultiProcessorCount, sms);
  if (err == cudaSuccess) err = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, smem_sm);
  if (err != cudaSuccess) return err;
  // Resident blocks: registers allow kMinBlocks (launch bounds), shared memory may allow fewer
  // (+ 1 KB per block that the driver reserves).
  int per_sm = std::max(1, std::min(Cfg::kMinBlocks, smem_sm / (Cfg::kSmemBytes + 1024)));
  const int64_t blocks = std::min<int64_t>((p.M + Cfg::BM - 1) / Cfg::BM, int64_t(sms) * per_sm);
  return launch_maybe_pdl(dim3(unsigned(blocks)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, kernel,
                          static_cast<const T*>(p.x), static_cast<const T*>(p.planes), static_cast<const T*>(p.bias),
                          static_cast<T*>(p.y), p.M, int(p.c), int(p.d));
}

template <class T, int KC, int DN>
cudaError_t dispatch_vec(const FwdParams& p, cudaStream_t stream) {
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool vec = aligned16(p.x) && aligned16(p.y) && (4 * p.c * int64_t(sizeof(T))) % 16 == 0 && p.d % 2 == 0;
  return vec ? launch<T, KC, DN, true>(p, stream) : launch<T, KC, DN, false>(p, stream);
}

// Whether fp16 / bf16 params suit the mma.sync variant (whole 16-byte chunks and channel pairs).
bool mma_ok(const FwdParams& p) {
  const auto aligned = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  return p.c % 2 == 0 && p.d % 2 == 0 && aligned(p.x, 16) && aligned(p.y, 16) && aligned(p.planes, 4);
}

template <class T>
cudaError_t dispatch(const FwdParams& p, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    if (mma_ok(p)) {
      int sms = 0;
      const cudaError_t err = device_attribute(cudaDevAttrMultiProcessorCount, sms);
      if (err != cudaSuccess) return err;
      if (p.d <= 16) return p.c <= 16 ? launch_mma<T, 16, 16>(p, sms, stream) : launch_mma<T, 32, 16>(p, sms, stream);
      return p.c <= 16 ? launch_mma<T, 16, 32>(p, sms, stream) : launch_mma<T, 32, 32>(p, sms, stream);
    }
  }
  if constexpr (sizeof(T) == 4) {
    if (p.c > 32 || p.d > 32) {  // exact FP32 up to kNarrowMaxCFp32
      if (p.c <= 32) return dispatch_vec<T, 32, 64>(p, stream);
      return p.d <= 32 ? dispatch_vec<T, 64, 32>(p, stream) : dispatch_vec<T, 64, 64>(p, stream);
    }
  }
  if (p.c <= 16) return p.d <= 16 ? dispatch_vec<T, 16, 16>(p, stream) : dispatch_vec<T, 16, 32>(p, stream);
  return p.d <= 16 ? dispatch_vec<T, 32, 16>(p, stream) : dispatch_vec<T, 32, 32>(p, stream);
}

// The largest c and d the narrow kernel has tiles for with this element size.
int64_t max_channels(int elem_bytes) { return elem_bytes == 4 ? kNarrowMaxCFp32 : kNarrowMaxC; }

// Whether the device gives one block the shared memory of the FP32 tiles for c or d in 33 .. 64
// (up to 224 KB: H100 yes, A100's 163 KB not for KC = 64).
bool wide_fp32_fits(const FwdParams& p) {
  const int need = p.c <= 32 ? NarrowCfg<float, 32, 64>::kSmemBytes
                   : p.d <= 32 ? NarrowCfg<float, 64, 32>::kSmemBytes
                               : NarrowCfg<float, 64, 64>::kSmemBytes;
  int optin = 0;
  if (device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, optin) != cudaSuccess) {
    cudaGetLastError();  // do not leave a query failure for a later launch check to report
    return false;
  }
  return optin >= need;
}

}  // namespace

bool eq_linear_fwd_narrow_applies(const FwdParams& p, int elem_bytes, bool tf32) {
  const char* v = debug_switch("narrow");
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  if (p.c < 1 || p.d < 1) return false;
  const bool wide = p.c > kNarrowMaxC || p.d > kNarrowMaxC;
  const bool fp32_tiles = elem_bytes == 4 && std::max(p.c, p.d) <= kNarrowMaxCFp32;  // within the FP32 tiles
  if (v != nullptr && std::strcmp(v, "1") == 0) return !wide || (fp32_tiles && wide_fp32_fits(p));
  // Exact FP32 with one of c, d <= 32 and the other <= 64 (KC or DN = 64 with the other 32): the
  // narrow tiles won; with both above 32 the tiled kernel wins (docs/kernels.md, Narrow forward).
  if (wide) return fp32_tiles && !tf32 && std::min(p.c, p.d) <= kNarrowMaxC && wide_fp32_fits(p);
  if (elem_bytes == 2) return mma_ok(p) || p.d <= kNarrowMaxDFfma16;
  return !tf32 || p.c * p.d <= kNarrowMaxCDTf32;
}

cudaError_t eq_linear_fwd_narrow(const FwdParams& p, int elem_bytes, bool bf16, cudaStream_t stream) {
  if (elem_bytes != 2 && elem_bytes != 4) return cudaErrorInvalidValue;
  if (p.gelu || p.y_f32 || p.x_parts != 1 || p.y_parts != 1) return cudaErrorNotSupported;
  if (p.M < 0 || p.c < 1 || p.d < 1 || p.c > max_channels(elem_bytes) || p.d > max_channels(elem_bytes))
    return cudaErrorInvalidValue;
  if (p.x == nullptr || p.planes == nullptr || p.y == nullptr) return cudaErrorInvalidValue;
  if (p.M == 0) return cudaSuccess;
  if (elem_bytes == 4) return dispatch<float>(p, stream);
  return bf16 ? dispatch<__nv_bfloat16>(p, stream) : dispatch<__half>(p, stream);
}

}  // namespace flash_eqlinear
