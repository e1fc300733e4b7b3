// Small plane-sized passes of the GEMM forms; see eq_plane_blocks.h. Grid-stride loops, one element
// per thread and step: the tensors are weight-sized (d x c), so these are launch-bound, not bandwidth-bound.

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_elem_convert.cuh"
#include "eq_plane_blocks.h"

namespace flash_eqlinear {
namespace {

// Blocks for n elements: enough to fill the GPU a few times over, no more.
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

template <class U>  // uint16_t or uint32_t: the element's bits
__global__ void __launch_bounds__(256) complex_block_kernel(const U* __restrict__ planes, U* __restrict__ out,
                                                            int64_t d, int64_t c) {
  constexpr U kSign = U(U(1) << (8 * sizeof(U) - 1));
  const int64_t total = 4 * d * c, stride = int64_t(gridDim.x) * blockDim.x;
  const U* pr = planes + d * c;
  const U* pi = planes + 2 * d * c;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t r = e / (2 * c), k = e - r * (2 * c);  // out row r in [0, 2d), column k in [0, 2c)
    const bool top = r < d, left = k < c;
    const int64_t src = (top ? r : r - d) * c + (left ? k : k - c);
    // [[PR, -PI], [PI, PR]]: PR on the diagonal blocks, PI below, -PI above.
    out[e] = top == left ? pr[src] : (top ? U(pi[src] ^ kSign) : pi[src]);
  }
}

template <class T>
__global__ void __launch_bounds__(256) pair_combine_kernel(const float* __restrict__ q, T* __restrict__ pr,
                                                           T* __restrict__ pi, int64_t d, int64_t c, float s) {
  const int64_t total = d * c, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t o = e / c, i = e - o * c;
    const float* top = q + o * 2 * c;
    const float* bottom = q + (d + o) * 2 * c;
    pr[e] = from_float<T>(s * (top[i] + bottom[c + i]));
    pi[e] = from_float<T>(s * (bottom[i] - top[c + i]));
  }
}

template <class T>
__global__ void __launch_bounds__(256) column_sums_kernel(const float* __restrict__ sums, T* __restrict__ out,
                                                          int64_t chunks, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) s += sums[k * n + j];
    out[j] = from_float<T>(s);
  }
}

template <class T>
cudaError_t pair_combine(const float* q, void* pr, void* pi, int64_t d, int64_t c, float s, cudaStream_t stream) {
  pair_combine_kernel<T><<<blocks_for(d * c), 256, 0, stream>>>(q, static_cast<T*>(pr), static_cast<T*>(pi), d, c, s);
  return cudaGetLastError();
}

template <class T>
cudaError_t column_sums(const float* sums, void* out, int64_t chunks, int64_t n, cudaStream_t stream) {
  column_sums_kernel<T><<<blocks_for(n), 256, 0, stream>>>(sums, static_cast<T*>(out), chunks, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t eq_complex_block(const void* planes, void* out, int64_t d, int64_t c, int elem_bytes,
                             cudaStream_t stream) {
  if (d < 1 || c < 1 || planes == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const unsigned grid = blocks_for(4 * d * c);
  if (elem_bytes == 4)
    complex_block_kernel<uint32_t><<<grid, 256, 0, stream>>>(static_cast<const uint32_t*>(planes),
                                                             static_cast<uint32_t*>(out), d, c);
  else
    complex_block_kernel<uint16_t><<<grid, 256, 0, stream>>>(static_cast<const uint16_t*>(planes),
                                                             static_cast<uint16_t*>(out), d, c);
  return cudaGetLastError();
}

cudaError_t eq_pair_combine(const float* q, void* pr, void* pi, int64_t d, int64_t c, float s, int elem_bytes,
                            bool bf16, cudaStream_t stream) {
  if (d < 1 || c < 1 || q == nullptr || pr == nullptr || pi == nullptr) return cudaErrorInvalidValue;
  if (elem_bytes == 4) return pair_combine<float>(q, pr, pi, d, c, s, stream);
  return bf16 ? pair_combine<__nv_bfloat16>(q, pr, pi, d, c, s, stream)
              : pair_combine<__half>(q, pr, pi, d, c, s, stream);
}

cudaError_t eq_column_sums(const float* sums, void* out, int64_t chunks, int64_t n, int elem_bytes, bool bf16,
                           cudaStream_t stream) {
  if (chunks < 0 || n < 1 || out == nullptr || (chunks > 0 && sums == nullptr)) return cudaErrorInvalidValue;
  if (elem_bytes == 4) return column_sums<float>(sums, out, chunks, n, stream);
  return bf16 ? column_sums<__nv_bfloat16>(sums, out, chunks, n, stream)
              : column_sums<__half>(sums, out, chunks, n, stream);
}

}  // namespace flash_eqlinear
