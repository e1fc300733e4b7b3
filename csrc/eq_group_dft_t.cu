// The group transforms of the GEMM form for T = 2 and 8: eq_group_dft_t.h.

#include <cstdint>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_elem_convert.cuh"
#include "eq_group_dft_t.h"

namespace flash_eqlinear {
namespace {

constexpr int kThreads = 256;

struct Q {
  float q[64];
};

// One thread per (row, channel): the T group values of x in (consecutive threads: consecutive channels, so
// each plane's stores are coalesced), the T plane values out.
template <int T, class E>
__global__ void __launch_bounds__(kThreads) analysis_kernel(const E* __restrict__ x, E* __restrict__ f, int64_t M,
                                                             int64_t c, Q q) {
  const int64_t total = M * c;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t row = i / c, ch = i - row * c;
    float v[T];
#pragma unroll
    for (int s = 0; s < T; ++s) v[s] = to_float<E>(x[i * T + s]);
    E* out = f + row * T * c + ch;
#pragma unroll
    for (int j = 0; j < T; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int s = 0; s < T; ++s) acc = fmaf(q.q[j * T + s], v[s], acc);
      out[j * c] = from_float<E>(acc);
    }
  }
}

// One thread per (row, output channel): its T plane products in (coalesced across threads per plane), the T
// group values out, contiguous.
template <int T, class E>
__global__ void __launch_bounds__(kThreads) synthesis_kernel(const float* __restrict__ a, const E* __restrict__ bias,
                                                              E* __restrict__ y, int64_t M, int64_t d, int64_t lda,
                                                              Q q) {
  const int64_t total = M * d;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t row = i / d, o = i - row * d;
    float v[T];
#pragma unroll
    for (int j = 0; j < T; ++j) v[j] = a[row * lda + j * d + o];
    const float b = bias != nullptr ? to_float<E>(bias[o]) : 0.f;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float acc = b;
#pragma unroll
      for (int j = 0; j < T; ++j) acc = fmaf(q.q[j * T + t], v[j], acc);
      y[i * T + t] = from_float<E>(acc);
    }
  }
}

unsigned blocks_for(int64_t total) {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t want = (total + kThreads - 1) / kThreads, cap = int64_t(sms) * 16;
  return unsigned(want < 1 ? 1 : want < cap ? want : cap);
}

Q basis_of(const GroupDftTParams& p) {
  Q q;
  for (int i = 0; i < 64; ++i) q.q[i] = p.q[i];
  return q;
}

template <int T, class E>
void launch(const GroupDftTParams& p, bool analysis, cudaStream_t stream) {
  const Q q = basis_of(p);
  if (analysis)
    analysis_kernel<T, E><<<blocks_for(p.M * p.n), kThreads, 0, stream>>>(static_cast<const E*>(p.src),
                                                                           static_cast<E*>(p.dst), p.M, p.n, q);
  else
    synthesis_kernel<T, E><<<blocks_for(p.M * p.n), kThreads, 0, stream>>>(
        static_cast<const float*>(p.src), static_cast<const E*>(p.bias), static_cast<E*>(p.dst), p.M, p.n, p.lda, q);
}

template <class E>
void launch_t(const GroupDftTParams& p, bool analysis, cudaStream_t stream) {
  if (p.T == 2) launch<2, E>(p, analysis, stream);
  else launch<8, E>(p, analysis, stream);
}

cudaError_t run(const GroupDftTParams& p, Elem elem, bool analysis, cudaStream_t stream) {
  if (!group_dft_t_supported(p.T) || p.M < 0 || p.n < 1 || (!analysis && p.lda < p.T * p.n))
    return cudaErrorInvalidValue;
  if (p.M == 0) return cudaSuccess;
  if (!p.src || !p.dst) return cudaErrorInvalidValue;
  switch (elem) {
    case Elem::kFloat: launch_t<float>(p, analysis, stream); break;
    case Elem::kHalf: launch_t<__half>(p, analysis, stream); break;
    case Elem::kBFloat16: launch_t<__nv_bfloat16>(p, analysis, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t eq_group_dft_t_analysis(const GroupDftTParams& p, Elem elem, cudaStream_t stream) {
  return run(p, elem, true, stream);
}

cudaError_t eq_group_dft_t_synthesis(const GroupDftTParams& p, Elem elem, cudaStream_t stream) {
  return run(p, elem, false, stream);
}

}  // namespace flash_eqlinear
