// Small passes over plane-sized tensors for the GEMM forms (eq_linear_host.cpp). Each replaces
// several ATen launches: the host cost per call, which sets the eager timings of mid-size layers.
//
// Torch-free: this header and the kernels compile with plain nvcc. Element types by size: 4 (float),
// 2 (bf16 ? __nv_bfloat16 : __half). All tensors contiguous.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flash_eqlinear {

// planes (4, d, c) -> out (2d, 2c) = [[PR, -PI], [PI, PR]] with PR = plane 1, PI = plane 2: bit copies,
// -PI by flipping the sign bit (exact in every type). The complex pair's GEMM operand.
cudaError_t eq_complex_block(const void* planes, void* out, int64_t d, int64_t c, int elem_bytes,
                             cudaStream_t stream);

// planes (4, d, c) -> out (5, d, c) = (P0, PR, (PI - PR) / 2, (PR + PI) / 2, P2): the GEMM form's operand
// planes with the complex pair as three products. The combinations in FP32, rounded once; the halves
// keep them within max |P| (fp16 range).
cudaError_t eq_gauss_planes(const void* planes, void* out, int64_t d, int64_t c, int elem_bytes, bool bf16,
                            cudaStream_t stream);

// q (2d, 2c) FP32 = [[q00, q01], [q10, q11]] -> pr = s (q00 + q11), pi = s (q10 - q01), each (d, c),
// rounded once to the element type: the weight gradient's complex pair from its one FP32 product (s:
// the scale its operands' layout leaves out).
cudaError_t eq_pair_combine(const float* q, void* pr, void* pi, int64_t d, int64_t c, float s, int elem_bytes,
                            bool bf16, cudaStream_t stream);

// sums (chunks, n) FP32 -> out (n,) = the chunks summed in order (deterministic), rounded once to the
// element type: grad_bias from the group DFT's per-chunk column sums.
cudaError_t eq_column_sums(const float* sums, void* out, int64_t chunks, int64_t n, int elem_bytes, bool bf16,
                           cudaStream_t stream);

// planes (4, d, c) -> adj (4, c, d): each plane transposed, plane 2 (PI) negated by its sign bit: the
// planes of the adjoint map, grad_x's operand for the forward kernels. One tiled pass.
cudaError_t eq_adjoint_planes(const void* planes, void* adj, int64_t d, int64_t c, int elem_bytes,
                              cudaStream_t stream);

// Rows per chunk of eq_block_column_sums, and the chunks its FP32 workspace holds for `rows` rows.
constexpr int64_t kColumnSumRows = 256;
inline int64_t eq_block_column_chunks(int64_t rows) { return (rows + kColumnSumRows - 1) / kColumnSumRows; }

// t (rows, n) FP32 -> out (n,) = its column sums, rounded once to the element type; deterministic
// (per-chunk sums into partial (eq_block_column_chunks(rows), n) FP32, then eq_column_sums). 16-byte
// loads: t 16-byte aligned, n % 4 == 0 (else cudaErrorInvalidValue). grad_bias from the partial sums
// of g0 that the Hopper kernel writes.
cudaError_t eq_block_column_sums(const float* t, int64_t rows, int64_t n, float* partial, void* out, int elem_bytes,
                                 bool bf16, cudaStream_t stream);

}  // namespace flash_eqlinear
