// A group-domain weight's frequency planes and the adjoint, one pass each: eq_group_planes.h.

#include <cstdint>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_elem_convert.cuh"
#include "eq_group_planes.h"

namespace flash_eqlinear {
namespace {

constexpr int kThreads = 256;

// One thread per group-weight row i: its T source values, T outputs. The forward reads a row's T values
// (consecutive threads: consecutive rows) and writes one value per plane (coalesced across the warp); the
// adjoint the reverse. The basis sits in shared memory, transposed for the adjoint.
template <class Src, class Dst, bool kAdjoint>
__global__ void __launch_bounds__(kThreads) group_planes_kernel(const Src* __restrict__ src, Dst* __restrict__ dst,
                                                                const float* __restrict__ basis, int64_t n, int T) {
  __shared__ float B[kGroupPlanesMaxT * kGroupPlanesMaxT];  // B[out][in]
  for (int j = threadIdx.x; j < T * T; j += kThreads) {
    const int k = j / T, t = j % T;  // basis[k][t]
    if (kAdjoint) B[t * T + k] = basis[j];
    else B[k * T + t] = basis[j];
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float v[kGroupPlanesMaxT];
#pragma unroll
  for (int t = 0; t < kGroupPlanesMaxT; ++t)
    if (t < T) v[t] = to_float<Src>(kAdjoint ? src[t * n + i] : src[i * T + t]);
#pragma unroll
  for (int k = 0; k < kGroupPlanesMaxT; ++k) {
    if (k >= T) break;
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < kGroupPlanesMaxT; ++t)
      if (t < T) acc = fmaf(B[k * T + t], v[t], acc);
    const Dst out = from_float<Dst>(acc);
    if (kAdjoint) dst[i * T + k] = out;
    else dst[k * n + i] = out;
  }
}

template <class Src, class Dst>
void launch(const GroupPlanesParams& p, cudaStream_t stream) {
  const unsigned blocks = unsigned((p.n + kThreads - 1) / kThreads);
  const auto* src = static_cast<const Src*>(p.src);
  auto* dst = static_cast<Dst*>(p.dst);
  if (p.adjoint) group_planes_kernel<Src, Dst, true><<<blocks, kThreads, 0, stream>>>(src, dst, p.basis, p.n, p.T);
  else group_planes_kernel<Src, Dst, false><<<blocks, kThreads, 0, stream>>>(src, dst, p.basis, p.n, p.T);
}

template <class Src>
void launch_dst(const GroupPlanesParams& p, cudaStream_t stream) {
  switch (p.dst_elem) {
    case Elem::kFloat: return launch<Src, float>(p, stream);
    case Elem::kHalf: return launch<Src, __half>(p, stream);
    case Elem::kBFloat16: return launch<Src, __nv_bfloat16>(p, stream);
  }
}

}  // namespace

cudaError_t eq_group_planes(const GroupPlanesParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.T < 1 || p.T > kGroupPlanesMaxT || (p.n > 0 && (!p.src || !p.dst || !p.basis)))
    return cudaErrorInvalidValue;
  if ((p.n + kThreads - 1) / kThreads > int64_t(0x7fffffff)) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  switch (p.src_elem) {
    case Elem::kFloat: launch_dst<float>(p, stream); break;
    case Elem::kHalf: launch_dst<__half>(p, stream); break;
    case Elem::kBFloat16: launch_dst<__nv_bfloat16>(p, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace flash_eqlinear
