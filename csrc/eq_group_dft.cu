// Group DFT of an interleaved (M, n, 4) tensor into Fourier planes (P, M, n), one pass: the
// operand layout of the GEMM form of the weight gradient (see eq_group_dft.h).

#include <cstdint>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_group_dft.h"
#include "eq_linear_bwd_weight_split.cuh"  // split::from_float

namespace flash_eqlinear {
namespace {

template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// The 4 group values of one channel travel as one aligned vector (8 bytes for 16-bit types).
template <class T> struct alignas(4 * sizeof(T)) Quad { T v[4]; };

// One thread per kC consecutive channels of a row (kC = 2 for 16-bit types when n is even: one
// 16-byte load, 4-byte stores): FP32 transform, one rounding per plane value, coalesced stores
// (consecutive threads write consecutive channels of each plane). e counts channel groups.
template <class T, int kC, bool kInput>
__global__ void __launch_bounds__(256) group_dft_kernel(const Quad<T>* __restrict__ src, T* __restrict__ dst,
                                                        int64_t groups, int64_t plane) {
  constexpr float kH = 0.70710678118654752f;
  constexpr int kPlanes = kInput ? 5 : 4;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < groups;
       e += int64_t(gridDim.x) * blockDim.x) {
    Quad<T> q[kC];
    if constexpr (kC == 2) {
      *reinterpret_cast<uint4*>(q) = reinterpret_cast<const uint4*>(src)[e];
    } else {
      q[0] = src[e];
    }
    T out[kPlanes][kC];
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      const float x0 = to_f(q[j].v[0]), x1 = to_f(q[j].v[1]), x2 = to_f(q[j].v[2]), x3 = to_f(q[j].v[3]);
      const float s02 = x0 + x2, s13 = x1 + x3;
      const float f0 = s02 + s13, f2 = s02 - s13, fr = x0 - x2, fi = x3 - x1;
      using split::from_float;
      if constexpr (kInput) {  // [f0/2, f2/2, -fI/sqrt2, fR/sqrt2, fI/sqrt2]
        out[0][j] = from_float<T>(0.5f * f0);
        out[1][j] = from_float<T>(0.5f * f2);
        out[2][j] = from_float<T>(-kH * fi);
        out[3][j] = from_float<T>(kH * fr);
        out[4][j] = from_float<T>(kH * fi);
      } else {  // [g0, g2, gR, gI]
        out[0][j] = from_float<T>(f0);
        out[1][j] = from_float<T>(f2);
        out[2][j] = from_float<T>(fr);
        out[3][j] = from_float<T>(fi);
      }
    }
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      T* const d = dst + pl * plane + e * kC;
      if constexpr (kC == 2) {
        *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(out[pl]);
      } else {
        d[0] = out[pl][0];
      }
    }
  }
}

template <class T, int kC>
void launch_kc(const GroupDftParams& p, int64_t blocks, cudaStream_t stream) {
  const int64_t total = p.M * p.n;
  const auto* src = static_cast<const Quad<T>*>(p.src);
  T* dst = static_cast<T*>(p.dst);
  if (p.input)
    group_dft_kernel<T, kC, true><<<unsigned(blocks), 256, 0, stream>>>(src, dst, total / kC, total);
  else
    group_dft_kernel<T, kC, false><<<unsigned(blocks), 256, 0, stream>>>(src, dst, total / kC, total);
}

template <class T>
cudaError_t launch(const GroupDftParams& p, cudaStream_t stream) {
  const int64_t total = p.M * p.n;
  if (total == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(p.src) % (4 * sizeof(T)) != 0) return cudaErrorInvalidValue;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  // Channel pairs: 16-bit types, n even (pairs never straddle rows; planes stay 4-byte aligned).
  const bool pairs = sizeof(T) == 2 && p.n % 2 == 0 && reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.dst) % 4 == 0;
  const int64_t blocks = split::imin(split::cdiv(pairs ? total / 2 : total, 256), int64_t(sms) * 16);
  if (pairs)
    launch_kc<T, 2>(p, blocks, stream);
  else
    launch_kc<T, 1>(p, blocks, stream);
  return cudaGetLastError();
}

}  // namespace

cudaError_t eq_group_dft(const GroupDftParams& p, int elem_bytes, bool bf16, cudaStream_t stream) {
  if (p.M < 0 || p.n < 1) return cudaErrorInvalidValue;
  if (p.M == 0) return cudaSuccess;
  if (p.src == nullptr || p.dst == nullptr) return cudaErrorInvalidValue;
  if (elem_bytes == 4) return launch<float>(p, stream);
  return bf16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
}

}  // namespace flash_eqlinear
