// Small passes of the GEMM forms; see eq_plane_blocks.h. The plane-sized ones are grid-stride loops, one
// element per thread and step: the tensors are weight-sized (d x c), so these are launch-bound, not
// bandwidth-bound. The block column sums: 16-byte loads, many in flight.

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_adjoint_tile.cuh"
#include "eq_elem_convert.cuh"
#include "eq_pdl.cuh"
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
__global__ void __launch_bounds__(256) gauss_planes_kernel(const T* __restrict__ planes, T* __restrict__ out,
                                                           int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const float pr = to_float(planes[n + e]), pi = to_float(planes[2 * n + e]);
    out[e] = planes[e];
    out[n + e] = planes[n + e];
    out[2 * n + e] = from_float<T>(0.5f * (pi - pr));
    out[3 * n + e] = from_float<T>(0.5f * (pr + pi));
    out[4 * n + e] = planes[3 * n + e];
  }
}

template <class T>
cudaError_t gauss_planes(const void* planes, void* out, int64_t n, cudaStream_t stream) {
  gauss_planes_kernel<T><<<blocks_for(n), 256, 0, stream>>>(static_cast<const T*>(planes), static_cast<T*>(out), n);
  return cudaGetLastError();
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
#pragma unroll 8  // independent loads in flight (a few hundred chunks, few threads: latency-bound)
    for (int64_t k = 0; k < chunks; ++k) s += sums[k * n + j];
    out[j] = from_float<T>(s);
  }
}

template <class U>
__global__ void __launch_bounds__(256) adjoint_planes_kernel(const U* __restrict__ planes, U* __restrict__ adj,
                                                             int64_t d, int64_t c) {
  pdl_wait();  // launched with programmatic dependent launch (eq_pdl.cuh)
  __shared__ U buf[32][33];
  adjoint_planes_tile(planes, adj, d, c, blockIdx.x, buf, threadIdx.x);
}

// Per-chunk column sums: a block covers kColumnSumRows rows and 128 columns (4 per 16-byte load); warp
// w of 8 sums rows w, w + 8, ... of the chunk (a warp reads 512 contiguous bytes of one row), then the 8
// warps' sums are added in shared memory (fixed order: deterministic).
__global__ void __launch_bounds__(256) block_column_partials_kernel(const float* __restrict__ t,
                                                                    float* __restrict__ partial, int64_t rows,
                                                                    int64_t n) {
  __shared__ float4 sums[8][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t col = (int64_t(blockIdx.x) * 32 + lane) * 4;
  const int64_t r0 = int64_t(blockIdx.y) * kColumnSumRows;
  const int64_t r1 = r0 + kColumnSumRows < rows ? r0 + kColumnSumRows : rows;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (col < n) {
#pragma unroll 4
    for (int64_t r = r0 + warp; r < r1; r += 8) {
      const float4 v = *reinterpret_cast<const float4*>(t + r * n + col);
      acc = make_float4(acc.x + v.x, acc.y + v.y, acc.z + v.z, acc.w + v.w);
    }
  }
  sums[warp][lane] = acc;
  __syncthreads();
  const int k = threadIdx.x;  // column blockIdx.x * 128 + k
  const int64_t cc = int64_t(blockIdx.x) * 128 + k;
  if (k >= 128 || cc >= n) return;
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) s += reinterpret_cast<const float*>(&sums[w][0])[k];
  partial[int64_t(blockIdx.y) * n + cc] = s;
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

template <class T>
cudaError_t block_column_sums(const float* t, int64_t rows, int64_t n, float* partial, void* out,
                              cudaStream_t stream) {
  if (n % 4 != 0 || reinterpret_cast<uintptr_t>(t) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t chunks = eq_block_column_chunks(rows);
  if (chunks > 65535) return cudaErrorInvalidConfiguration;  // > 16.7 M rows
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>((n + 127) / 128), static_cast<unsigned>(chunks));
    block_column_partials_kernel<<<grid, 256, 0, stream>>>(t, partial, rows, n);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return column_sums<T>(partial, out, chunks, n, stream);
}

}  // namespace

cudaError_t eq_adjoint_planes(const void* planes, void* adj, int64_t d, int64_t c, int elem_bytes,
                              cudaStream_t stream) {
  if (d < 1 || c < 1 || planes == nullptr || adj == nullptr) return cudaErrorInvalidValue;
  const int64_t tiles = adjoint_planes_tiles(d, c);
  if (tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const unsigned grid = static_cast<unsigned>(tiles);
  if (elem_bytes == 4)
    return launch_maybe_pdl(dim3(grid), dim3(256), 0, stream, adjoint_planes_kernel<uint32_t>,
                            static_cast<const uint32_t*>(planes), static_cast<uint32_t*>(adj), d, c);
  return launch_maybe_pdl(dim3(grid), dim3(256), 0, stream, adjoint_planes_kernel<uint16_t>,
                          static_cast<const uint16_t*>(planes), static_cast<uint16_t*>(adj), d, c);
}

cudaError_t eq_block_column_sums(const float* t, int64_t rows, int64_t n, float* partial, void* out, int elem_bytes,
                                 bool bf16, cudaStream_t stream) {
  if (rows < 0 || n < 1 || out == nullptr || (rows > 0 && (t == nullptr || partial == nullptr)))
    return cudaErrorInvalidValue;
  if (elem_bytes == 4) return block_column_sums<float>(t, rows, n, partial, out, stream);
  return bf16 ? block_column_sums<__nv_bfloat16>(t, rows, n, partial, out, stream)
              : block_column_sums<__half>(t, rows, n, partial, out, stream);
}

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

cudaError_t eq_gauss_planes(const void* planes, void* out, int64_t d, int64_t c, int elem_bytes, bool bf16,
                            cudaStream_t stream) {
  if (d < 1 || c < 1 || planes == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (elem_bytes == 4) return gauss_planes<float>(planes, out, d * c, stream);
  return bf16 ? gauss_planes<__nv_bfloat16>(planes, out, d * c, stream)
              : gauss_planes<__half>(planes, out, d * c, stream);
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
