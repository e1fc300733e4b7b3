// Shared device helpers of the exact-FP32 SIMT tile kernels (forward and weight gradient): a lane's
// register fragment from shared memory, and the per-k outer product into an accumulator set. In an
// anonymous namespace: each kernel file has its own copy.
#pragma once

#include <cuda_runtime.h>

namespace flash_eqlinear {
namespace {

// dst[4q .. 4q + 3] = the float4 at src + q * step (shared memory), q < N / 4.
template <int N>
__device__ __forceinline__ void load_float4s(float (&dst)[N], const float* src, int step) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 v = *reinterpret_cast<const float4*>(src + q * step);
    dst[4 * q + 0] = v.x;
    dst[4 * q + 1] = v.y;
    dst[4 * q + 2] = v.z;
    dst[4 * q + 3] = v.w;
  }
}

// acc += sign * aa bb^T for one k (TM x TN FFMA); the sign becomes an FFMA operand negation.
template <int TM, int TN>
__device__ __forceinline__ void outer_fma(float (&acc)[TM][TN], const float (&aa)[TM], const float (&bb)[TN],
                                          float sign = 1.f) {
#pragma unroll
  for (int j = 0; j < TN; ++j) {
#pragma unroll
    for (int i = 0; i < TM; ++i) acc[i][j] = fmaf(sign * aa[i], bb[j], acc[i][j]);
  }
}

}  // namespace
}  // namespace flash_eqlinear
