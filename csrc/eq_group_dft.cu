// Group DFT of an interleaved (M, n, 4) tensor into Fourier planes (4, M, n) or column blocks (M, 4n),
// and the inverse DFT of FP32 plane products back to (M, d, 4), one pass each; layouts and the GEMM
// forms they serve: eq_group_dft.h.

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_group_dft.h"
#include "eq_elem_convert.cuh"
#include "eq_linear_bwd_weight_split.cuh"  // split::cdiv, imin
#include "eq_p4_transform.cuh"

namespace flash_eqlinear {
namespace {


// Raw 32-bit words <-> elements: 16-bit types two per word (low half first), float one per word.
template <class T> __device__ __forceinline__ float word_elem(const uint32_t* w, int e) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w[e]);
  } else {
    const auto h = static_cast<unsigned short>(w[e / 2] >> (16 * (e % 2)));
    if constexpr (std::is_same_v<T, __half>) return __half2float(__ushort_as_half(h));
    else return __bfloat162float(__ushort_as_bfloat16(h));
  }
}
template <class T> __device__ __forceinline__ uint32_t elem_bits(float v) {
  const T t = from_float<T>(v);
  if constexpr (sizeof(T) == 4) return __float_as_uint(t);
  else if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(t);
  else return __bfloat16_as_ushort(t);
}

// kW words from global memory: 8 bytes (8-byte aligned) or a multiple of 16 (16-byte aligned).
template <int kW> __device__ __forceinline__ void load_words(uint32_t (&w)[kW], const void* p) {
  if constexpr (kW == 2) {
    const uint2 v = __ldg(static_cast<const uint2*>(p));
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(kW % 4 == 0, "16-byte loads");
#pragma unroll
    for (int i = 0; i < kW / 4; ++i) {
      const uint4 v = __ldg(static_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
}

// kC consecutive elements (their bits in b) in one store of kC * sizeof(T) bytes.
template <class T, int kC> __device__ __forceinline__ void store_elems(T* dst, const uint32_t (&b)[kC]) {
  constexpr int kBytes = kC * int(sizeof(T));
  constexpr bool k16 = sizeof(T) == 2;
  if constexpr (kBytes == 2) {
    *reinterpret_cast<unsigned short*>(dst) = static_cast<unsigned short>(b[0]);
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<uint32_t*>(dst) = k16 ? (b[0] | b[1 % kC] << 16) : b[0];
  } else {
    static_assert(kBytes == 8, "4-, 2- or 1-element stores");
    const uint32_t lo = k16 ? b[0] | b[1] << 16 : b[0], hi = k16 ? b[2 % kC] | b[3 % kC] << 16 : b[1 % kC];
    // Inline PTX: left to itself the compiler split some of these into two 4-byte stores.
    asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(dst), "r"(lo), "r"(hi) : "memory");
  }
}

// Rows each thread has in flight per loop step (independent 8-32 byte loads hide DRAM latency).
constexpr int kRowsInFlight = 2;

// Threads own kC consecutive channels (kC = 4 for 16-bit types, 2 for float, where n is a multiple
// and the pointers allow: two 16-byte loads and 8-byte stores per plane; else kC = 2 or 1 with
// narrower accesses; see channels_per_thread) and walk rows:
// blockIdx.y picks a chunk of rows, and a block covers W channel groups x (256 / W) rows at a time
// (W = min(groups per row, 256)), so consecutive threads touch consecutive channels (coalesced
// loads and stores), kRowsInFlight rows per step. FP32 transform, one rounding per plane value.
// With `sums`, each chunk also writes the FP32 column sums of f0 over its rows (sums[chunk][ch]),
// reduced inside the block in a fixed order: deterministic.
template <class T, int kC, bool kInput>
__global__ void __launch_bounds__(256) group_dft_kernel(const T* __restrict__ src, T* __restrict__ dst,
                                                        int64_t M, int64_t gpr, int W, int64_t rows_per_chunk,
                                                        bool blocks, bool halve, bool gauss,
                                                        float* __restrict__ sums) {
  constexpr float kH = 0.70710678118654752f;
  constexpr int kU = kRowsInFlight;
  const int kPlanes = gauss ? 5 : 4;  // gauss: blocks, input = false only (the host checks)
  constexpr int kW = kC * int(sizeof(T));  // 32-bit words of one thread's kC quads (4 elements each)
  const int R = 256 / W, lane = threadIdx.x % W, row_off = threadIdx.x / W;
  const int64_t cg = int64_t(blockIdx.x) * W + lane;
  const bool active = row_off < R && cg < gpr;
  const int64_t n = gpr * kC;
  const int64_t plane = blocks ? n : M * n, row_stride = blocks ? kPlanes * n : n;
  const int64_t r_end = M < (int64_t(blockIdx.y) + 1) * rows_per_chunk ? M : (int64_t(blockIdx.y) + 1) * rows_per_chunk;
  const float hs = halve ? 0.5f : 1.f;  // the input = false layout's scale (a power of two: exact)
  float acc[kC] = {};
  for (int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk + row_off; active && r0 < r_end; r0 += kU * R) {
    uint32_t w[kU][kW];
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // all loads first
      const int64_t r = r0 + u * R;
      if (r < r_end) load_words(w[u], src + (r * gpr + cg) * 4 * kC);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t r = r0 + u * R;
      if (r >= r_end) break;
      uint32_t out[5][kC];
#pragma unroll
      for (int j = 0; j < kC; ++j) {
        float f0, fr, fi, f2;
        dft4<false>(word_elem<T>(w[u], 4 * j), word_elem<T>(w[u], 4 * j + 1), word_elem<T>(w[u], 4 * j + 2),
                    word_elem<T>(w[u], 4 * j + 3), f0, fr, fi, f2);
        acc[j] += f0;
        if constexpr (kInput) {  // [f0/2, f2/2, fR/sqrt2, fI/sqrt2]
          out[0][j] = elem_bits<T>(0.5f * f0);
          out[1][j] = elem_bits<T>(0.5f * f2);
          out[2][j] = elem_bits<T>(kH * fr);
          out[3][j] = elem_bits<T>(kH * fi);
        } else if (gauss) {  // [g0, g2, (gR + gI) / 2, gR, gI], each times hs
          out[0][j] = elem_bits<T>(hs * f0);
          out[1][j] = elem_bits<T>(hs * f2);
          out[2][j] = elem_bits<T>(0.5f * hs * (fr + fi));
          out[3][j] = elem_bits<T>(hs * fr);
          out[4][j] = elem_bits<T>(hs * fi);
        } else {  // [g0, g2, gR, gI]
          out[0][j] = elem_bits<T>(hs * f0);
          out[1][j] = elem_bits<T>(hs * f2);
          out[2][j] = elem_bits<T>(hs * fr);
          out[3][j] = elem_bits<T>(hs * fi);
        }
      }
#pragma unroll
      for (int pl = 0; pl < 5; ++pl)
        if (pl < kPlanes) store_elems<T, kC>(dst + pl * plane + r * row_stride + cg * kC, out[pl]);
    }
  }
  if (sums == nullptr) return;  // uniform across the grid
  __shared__ float red[kC][256];
#pragma unroll
  for (int j = 0; j < kC; ++j) red[j][threadIdx.x] = acc[j];
  __syncthreads();
  if (row_off != 0 || cg >= gpr) return;
#pragma unroll
  for (int j = 0; j < kC; ++j) {
    float s = 0.f;
    for (int k = 0; k < R; ++k) s += red[j][k * W + lane];
    sums[int64_t(blockIdx.y) * gpr * kC + cg * kC + j] = s;
  }
}

struct Grid {
  int W;
  int64_t bx, chunks, rows_per_chunk;
};

// The launch shape for n channel groups per row: enough blocks for ~8 per SM, chunks of rows.
Grid grid_for(int64_t M, int64_t gpr, int sms) {
  Grid g;
  g.W = int(split::imin(gpr, 256));
  g.bx = split::cdiv(gpr, g.W);
  const int64_t R = 256 / g.W;
  g.chunks = split::imin(split::imin(split::cdiv(int64_t(sms) * 8, g.bx), split::cdiv(M, 4 * R)), 65535);
  if (g.chunks < 1) g.chunks = 1;
  g.rows_per_chunk = split::cdiv(M, g.chunks);
  g.chunks = M > 0 ? split::cdiv(M, g.rows_per_chunk) : 1;
  return g;
}

// Channels per thread: the widest of 4 (16-bit types) or 2 (float) down to 1 that divides n and
// whose loads (16 bytes) and per-plane stores (kC elements) stay aligned.
int channels_per_thread(const GroupDftParams& p, int elem_bytes) {
  const auto aligned = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  for (int kc = elem_bytes == 2 ? 4 : 2; kc > 1; kc /= 2)
    if (p.n % kc == 0 && aligned(p.src, 16) && aligned(p.dst, uintptr_t(kc) * elem_bytes)) return kc;
  return 1;
}

cudaError_t sm_count(int* sms) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  return e;
}

template <class T, int kC>
void launch_kc(const GroupDftParams& p, const Grid& g, cudaStream_t stream) {
  const auto* src = static_cast<const T*>(p.src);
  T* dst = static_cast<T*>(p.dst);
  const dim3 grid(unsigned(g.bx), unsigned(g.chunks));
  const int64_t gpr = p.n / kC;
  if (p.input)
    group_dft_kernel<T, kC, true><<<grid, 256, 0, stream>>>(src, dst, p.M, gpr, g.W, g.rows_per_chunk, p.blocks,
                                                            p.halve, false, p.sums);
  else
    group_dft_kernel<T, kC, false><<<grid, 256, 0, stream>>>(src, dst, p.M, gpr, g.W, g.rows_per_chunk, p.blocks,
                                                             p.halve, p.gauss, p.sums);
}

template <class T>
cudaError_t launch(const GroupDftParams& p, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(p.src) % (4 * sizeof(T)) != 0) return cudaErrorInvalidValue;
  int sms = 0;
  if (const cudaError_t e = sm_count(&sms); e != cudaSuccess) return e;
  const int kc = channels_per_thread(p, sizeof(T));
  const Grid g = grid_for(p.M, p.n / kc, sms);
  if (p.sums != nullptr && g.chunks > p.sum_chunks) return cudaErrorInvalidValue;
  if constexpr (sizeof(T) == 2) {
    if (kc == 4) launch_kc<T, 4>(p, g, stream);
  }
  if (kc == 2) launch_kc<T, 2>(p, g, stream);
  if (kc == 1) launch_kc<T, 1>(p, g, stream);
  return cudaGetLastError();
}

// kC output channels per thread (2 where d, lda and a allow 8-byte loads), rows walked as in
// group_dft_kernel (blockIdx.y: a chunk of rows; a block: W channel groups x 256 / W rows), no
// per-element division: per row, kC-wide loads from the four column blocks, the inverse transform in
// FP32 and one rounding to T, and the kC channels' 4 kC outputs in one store (16 bytes, or 8 for one
// 16-bit channel).
template <class T, int kC>
__global__ void __launch_bounds__(256) group_idft_kernel(GroupIdftParams p, int64_t gpr, int W, int64_t rows_per_chunk) {
  constexpr int kU = kRowsInFlight;
  const int R = 256 / W, lane = threadIdx.x % W, row_off = threadIdx.x / W;
  const int64_t cg = int64_t(blockIdx.x) * W + lane;
  if (row_off >= R || cg >= gpr) return;  // no barriers below
  const int64_t d = p.d, o0 = cg * kC;
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
  float b[kC];
#pragma unroll
  for (int j = 0; j < kC; ++j) b[j] = bias != nullptr ? to_float(bias[o0 + j]) : 0.f;
  const bool halved = p.halved, gauss = p.gauss;
  // Channel j of one row's loaded blocks v; with gauss [a0, a2, k1, k2, k3]: aR = 2 (k1 - k3), aI = 2 (k1 + k2).
  const auto idft = [halved, gauss, &b](const float (&v)[5][kC], int j) {
    const float ar = gauss ? 2.f * (v[2][j] - v[4][j]) : v[2][j];
    const float ai = gauss ? 2.f * (v[2][j] + v[3][j]) : v[3][j];
    return halved ? inverse_dft4_f32<true>(v[0][j], v[1][j], ar, ai, b[j])
                  : inverse_dft4_f32<false>(v[0][j], v[1][j], ar, ai, b[j]);
  };
  const int blocks = gauss ? 5 : 4;
  const int64_t r_end = p.M < (int64_t(blockIdx.y) + 1) * rows_per_chunk ? p.M : (int64_t(blockIdx.y) + 1) * rows_per_chunk;
  for (int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk + row_off; r0 < r_end; r0 += kU * R) {
    float v[kU][5][kC];
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // all loads first
      const int64_t r = r0 + u * R;
      if (r >= r_end) break;
      const float* row = p.a + r * p.lda + o0;
#pragma unroll
      for (int g = 0; g < 5; ++g) {
        if (g >= blocks) break;
        if constexpr (kC == 2) {
          const float2 t = __ldg(reinterpret_cast<const float2*>(row + g * d));
          v[u][g][0] = t.x;
          v[u][g][1] = t.y;
        } else {
          v[u][g][0] = __ldg(row + g * d);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t r = r0 + u * R;
      if (r >= r_end) break;
      T* dst = y + (r * d + o0) * 4;
      if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int j = 0; j < kC; ++j)
          reinterpret_cast<float4*>(dst)[j] = idft(v[u], j);
      } else {
        uint32_t w[2 * kC];  // (y0, y1), (y2, y3) per channel
#pragma unroll
        for (int j = 0; j < kC; ++j) {
          const float4 q = idft(v[u], j);
          w[2 * j] = elem_bits<T>(q.x) | elem_bits<T>(q.y) << 16;
          w[2 * j + 1] = elem_bits<T>(q.z) | elem_bits<T>(q.w) << 16;
        }
        if constexpr (kC == 2)
          *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        else
          *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
      }
    }
  }
}

template <class T>
cudaError_t launch_idft(const GroupIdftParams& p, cudaStream_t stream) {
  int sms = 0;
  if (const cudaError_t e = sm_count(&sms); e != cudaSuccess) return e;
  const bool pairs = p.d % 2 == 0 && p.lda % 2 == 0 && reinterpret_cast<uintptr_t>(p.a) % 8 == 0;
  const Grid g = grid_for(p.M, pairs ? p.d / 2 : p.d, sms);
  const dim3 grid(unsigned(g.bx), unsigned(g.chunks));
  if (pairs)
    group_idft_kernel<T, 2><<<grid, 256, 0, stream>>>(p, p.d / 2, g.W, g.rows_per_chunk);
  else
    group_idft_kernel<T, 1><<<grid, 256, 0, stream>>>(p, p.d, g.W, g.rows_per_chunk);
  return cudaGetLastError();
}

__device__ __forceinline__ float tf32_hi(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
  return __uint_as_float(r);
}

// One thread per (row, channel): the block offsets of eq_group_dft_split_fp32's layout.
__global__ void __launch_bounds__(256) group_dft_split_kernel(const float4* __restrict__ x, float* __restrict__ dst,
                                                              int64_t M, int64_t c) {
  const int64_t total = M * c, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t m = e / c, ci = e - m * c;
    const float4 q = x[e];
    float f[4];  // f0, f2, fR, fI
    dft4<false>(q.x, q.y, q.z, q.w, f[0], f[2], f[3], f[1]);
    constexpr int kHi[4] = {0, 2, 4, 5}, kLo[4] = {1, 3, 6, 7};
    float* row = dst + m * 8 * c + ci;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float hi = tf32_hi(f[j]);
      row[kHi[j] * c] = hi;
      row[kLo[j] * c] = f[j] - hi;
    }
  }
}

}  // namespace

cudaError_t eq_group_dft_split_fp32(const float* x, float* dst, int64_t M, int64_t c, cudaStream_t stream) {
  if (M < 0 || c < 1) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  if (x == nullptr || dst == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0) return cudaErrorInvalidValue;
  int sms = 0;
  if (const cudaError_t e = sm_count(&sms); e != cudaSuccess) return e;
  const int64_t blocks = split::imin(split::cdiv(M * c, 256), int64_t(sms) * 16);
  group_dft_split_kernel<<<unsigned(blocks), 256, 0, stream>>>(reinterpret_cast<const float4*>(x), dst, M, c);
  return cudaGetLastError();
}

cudaError_t eq_group_idft(const GroupIdftParams& p, int elem_bytes, bool bf16, cudaStream_t stream) {
  if (p.M < 0 || p.d < 1 || p.lda < (p.gauss ? 5 : 4) * p.d) return cudaErrorInvalidValue;
  if (p.M == 0) return cudaSuccess;
  if (p.a == nullptr || p.y == nullptr || reinterpret_cast<uintptr_t>(p.y) % 16 != 0) return cudaErrorInvalidValue;
  if (elem_bytes == 4) return launch_idft<float>(p, stream);
  return bf16 ? launch_idft<__nv_bfloat16>(p, stream) : launch_idft<__half>(p, stream);
}

int64_t eq_group_dft_sum_chunks(const GroupDftParams& p, int elem_bytes) {
  int sms = 0;
  if (p.M < 0 || p.n < 1 || sm_count(&sms) != cudaSuccess) return 0;
  return grid_for(p.M, p.n / channels_per_thread(p, elem_bytes), sms).chunks;
}

cudaError_t eq_group_dft(const GroupDftParams& p, int elem_bytes, bool bf16, cudaStream_t stream) {
  if (p.M < 0 || p.n < 1 || (p.gauss && (p.input || !p.blocks))) return cudaErrorInvalidValue;
  if (p.src == nullptr || p.dst == nullptr) return p.M == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (p.M == 0 && p.sums == nullptr) return cudaSuccess;
  if (elem_bytes == 4) return launch<float>(p, stream);
  return bf16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
}

}  // namespace flash_eqlinear
