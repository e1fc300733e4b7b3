// Fused p4 EQ-Linear forward for narrow layers (c <= 32, d <= 64), every element type: one thread
// per row, FP32 SIMT. Math and layouts: eq_linear_fwd.h.
//
// At these sizes the layer is a few MB of x and y and a few hundred MACs per row: the tile kernels
// spend most of their time on padding (a 32- or 16-channel k tile for 16 channels, 64-channel output
// tiles for 16) and on pipeline fill, and F.linear runs near the copy bandwidth. Here a thread loads
// its row's c channels (one 8- or 16-byte load per channel: the 4 group values), transforms them into
// registers (F0, FR, FI, F2 in FP32), then walks the output channels: per (o, ci) one broadcast
// 16-byte shared-memory load of the four plane values feeds six FMAs; per o one 8- or 16-byte store
// of y[row, o, 0..3]. FP32 throughout (exact for float inputs; one rounding per output otherwise),
// so float tensors get exact FP32 arithmetic whatever the TF32 setting.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_linear_fwd.h"
#include "eq_linear_fwd_small.h"

namespace flash_eqlinear {
namespace {

constexpr int kThreads = 128, kMaxD = 64;

template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The 4 group values of one channel: one aligned 8-byte (16-bit types) or 16-byte (float) access.
template <class T> struct alignas(4 * sizeof(T)) Quad { T v[4]; };

// kC: channels held in registers (c <= kC; the loops run to c, unrolled up to kC).
template <class T, int kC>
__global__ void __launch_bounds__(kThreads) small_fwd_kernel(const Quad<T>* __restrict__ x,
                                                             const T* __restrict__ planes, const T* __restrict__ bias,
                                                             Quad<T>* __restrict__ y, int64_t M, int c, int d) {
  __shared__ float4 sp[kMaxD * kC];  // (P0, PR, PI, P2) of (o, ci) at o * kC + ci
  __shared__ float sb[kMaxD];
  const int64_t plane = int64_t(d) * c;
  for (int i = threadIdx.x; i < d * kC; i += kThreads) {
    const int o = i / kC, ci = i - o * kC;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ci < c) {
      const int64_t e = int64_t(o) * c + ci;
      v = make_float4(to_f(planes[e]), to_f(planes[plane + e]), to_f(planes[2 * plane + e]),
                      to_f(planes[3 * plane + e]));
    }
    sp[i] = v;
  }
  for (int o = threadIdx.x; o < d; o += kThreads) sb[o] = bias != nullptr ? to_f(bias[o]) : 0.f;
  __syncthreads();

  const int64_t m = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (m >= M) return;
  float f0[kC], f2[kC], fr[kC], fi[kC];
#pragma unroll
  for (int ci = 0; ci < kC; ++ci) {
    Quad<T> q{};
    if (ci < c) q = x[m * c + ci];
    const float x0 = to_f(q.v[0]), x1 = to_f(q.v[1]), x2 = to_f(q.v[2]), x3 = to_f(q.v[3]);
    const float s02 = x0 + x2, s13 = x1 + x3;
    f0[ci] = s02 + s13;
    f2[ci] = s02 - s13;
    fr[ci] = x0 - x2;
    fi[ci] = x3 - x1;
  }
  constexpr float kH = 0.70710678118654752f;
  for (int o = 0; o < d; ++o) {
    float a0 = 0.f, a2 = 0.f, ar = 0.f, ai = 0.f;
    const float4* row = sp + o * kC;
#pragma unroll
    for (int ci = 0; ci < kC; ++ci) {  // padded channels hold zero planes and zero inputs
      const float4 p = row[ci];
      a0 = fmaf(f0[ci], p.x, a0);
      a2 = fmaf(f2[ci], p.w, a2);
      ar = fmaf(fr[ci], p.y, fmaf(-fi[ci], p.z, ar));
      ai = fmaf(fr[ci], p.z, fmaf(fi[ci], p.y, ai));
    }
    const float s = fmaf(0.5f, a0 + a2, sb[o]), t = fmaf(0.5f, a0 - a2, sb[o]);
    Quad<T> out;
    out.v[0] = from_f<T>(fmaf(kH, ar, s));
    out.v[1] = from_f<T>(fmaf(-kH, ai, t));
    out.v[2] = from_f<T>(fmaf(-kH, ar, s));
    out.v[3] = from_f<T>(fmaf(kH, ai, t));
    y[m * d + o] = out;
  }
}

template <class T, int kC>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.M + kThreads - 1) / kThreads;
  small_fwd_kernel<T, kC><<<unsigned(blocks), kThreads, 0, stream>>>(
      static_cast<const Quad<T>*>(p.x), static_cast<const T*>(p.planes), static_cast<const T*>(p.bias),
      static_cast<Quad<T>*>(p.y), p.M, int(p.c), int(p.d));
  return cudaGetLastError();
}

template <class T>
cudaError_t dispatch(const FwdParams& p, cudaStream_t stream, bool* launched) {
  *launched = false;
  const int max_c = sizeof(T) == 4 ? 32 : 16;  // where it beats the tile kernels (H100)
  if (!small_path_enabled() || p.M <= 0 || p.c > max_c || p.d > kMaxD || p.M > (int64_t(0x7fffffff) * kThreads) ||
      reinterpret_cast<uintptr_t>(p.x) % (4 * sizeof(T)) != 0 || reinterpret_cast<uintptr_t>(p.y) % (4 * sizeof(T)) != 0)
    return cudaSuccess;
  *launched = true;
  if (p.c <= 8) return launch<T, 8>(p, stream);
  if (p.c <= 16) return launch<T, 16>(p, stream);
  return launch<T, 32>(p, stream);
}

}  // namespace

bool small_path_enabled() {
  const char* v = std::getenv("FLASH_EQLINEAR_SMALL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

cudaError_t eq_linear_fwd_small(const FwdParams& p, int elem_bytes, bool bf16, cudaStream_t stream, bool* launched) {
  if (elem_bytes == 4) return dispatch<float>(p, stream, launched);
  return bf16 ? dispatch<__nv_bfloat16>(p, stream, launched) : dispatch<__half>(p, stream, launched);
}

}  // namespace flash_eqlinear
