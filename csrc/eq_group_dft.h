// Group DFT (T = 4) of an interleaved tensor into separate Fourier planes, and its inverse: the passes
// around cuBLAS's plane products in the GEMM forms (the weight gradient, grad_x, the TF32 and large
// fp16 / bf16 forwards; flash_eqlinear bindings).
//
// Torch-free on purpose: this header and the kernel compile with plain nvcc.
//
//   src (M, n, 4)  interleaved, contiguous, aligned to 4 elements; f0 = x0+x1+x2+x3,
//                  fR = x0-x2, fI = x3-x1, f2 = x0-x1+x2-x3 per (row, channel).
//   dst            contiguous planes, each (M, n) (or, with `blocks`, one (M, 4n) matrix whose row m
//                  holds the 4 planes' rows side by side):
//     input = true:  [f0/2, f2/2, fR/sqrt2, fI/sqrt2]  (x: the weight-gradient scales folded in)
//     input = false: [g0, g2, gR, gI]  (grad_y, unscaled: small fp16 gradients keep their precision),
//                    or with `halve` [f0/2, f2/2, fR/2, fI/2] (x for the forward's GEMM form: in fp16
//                    x0+x1+x2+x3 overflows for |x| > 16384, its half not for |x| <= 32752; exact)
// FP32 arithmetic, one rounding per stored value. Element type float, __half or __nv_bfloat16.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flash_eqlinear {

struct GroupDftParams {
  const void* src;
  void* dst;
  int64_t M;               // rows (>= 0)
  int64_t n;               // channels (>= 1)
  bool input;              // true: the x layout (scaled); false: the grad_y layout
  bool blocks = false;     // false: planes (4, M, n); true: column blocks (M, 4n), row m = [plane 0 | ...]
  bool halve = false;      // input = false only: all four planes halved
  bool gauss = false;      // blocks, input = false only: a fifth block, placed third, s/2 with s = fR + fI:
                           // dst (M, 5n) = [f0 | f2 | s/2 | fR | fI], each times 1/2 with halve (the
                           // forward's three-product complex term: eq_linear_host.cpp,
                           // fourier_products_into)
  float* sums = nullptr;   // optional (sum_chunks, n) FP32: row-chunk partial column sums of f0 (the
                           // unrounded x0+x1+x2+x3; for grad_y: grad_bias = sums summed over chunks)
  int64_t sum_chunks = 0;  // rows of `sums`: eq_group_dft_sum_chunks(p, elem_bytes), first rows written
};

// Row chunks (rows of `sums`) a launch with these sizes and pointers uses on the current device
// (a pure function of M, n, alignment and the SM count: the sums are deterministic). 0 on error.
int64_t eq_group_dft_sum_chunks(const GroupDftParams& p, int elem_bytes);

// One launch on `stream`; elem_bytes 4 (float) or 2 (bf16 ? __nv_bfloat16 : __half).
// cudaErrorInvalidValue for bad sizes or pointers, or `sums` with fewer than the needed chunks.
cudaError_t eq_group_dft(const GroupDftParams& p, int elem_bytes, bool bf16, cudaStream_t stream);

// Group DFT of FP32 x, split for 3xTF32 GEMMs: f = hi + lo with hi = f rounded to TF32 (to nearest)
// and lo = f - hi (exact), written per row as the column blocks (each c wide)
//   [f0 hi | f0 lo | f2 hi | f2 lo | fR hi | fI hi | fR lo | fI lo]   -> dst (M, 8c)
// so that [f hi | f lo] of each real plane and [fR fI hi | fR fI lo] are contiguous K ranges.
// x (M, c, 4) must be 16-byte aligned.
cudaError_t eq_group_dft_split_fp32(const float* x, float* dst, int64_t M, int64_t c, cudaStream_t stream);

// Inverse group DFT + bias (the last pass of the GEMM forms: the TF32 / 3xTF32 / fp16 / bf16 forwards
// and grad_x; flash_eqlinear bindings):
//   a (M, 4d) FP32 column blocks [a0 | a2 | aR | aI] (row stride lda >= 4d), bias (d,) or nullptr ->
//   y (M, d, 4) contiguous with y0 = a0/2 + a2/2 + h aR, y1 = a0/2 - a2/2 - h aI,
//   y2 = a0/2 + a2/2 - h aR, y3 = a0/2 - a2/2 + h aI (+ bias[o]), h = sqrt(2)/2: the p4 epilogue of
//   DESIGN.md for the six plane products a0 = f0 P0^T, a2 = f2 P2^T, aR = fR PR^T - fI PI^T,
//   aI = fR PI^T + fI PR^T; with `halved`, a holds half of those products (from halved input planes):
//   y0 = a0 + a2 + sqrt2 aR etc. FP32 arithmetic, one rounding per output. y and bias have the element
//   type (elem_bytes 4: float; 2: bf16 ? __nv_bfloat16 : __half); y must be 16-byte aligned.
//   With `gauss`: a (M, 5d) = [a0 | a2 | k1 | k2 | k3] (lda >= 5d), the complex pair as three products
//   at half the scale of a0 and a2, aR = 2 (k1 - k3) and aI = 2 (k1 + k2).
struct GroupIdftParams {
  const float* a;
  const void* bias;  // nullptr: none
  void* y;
  int64_t M, d, lda;
  bool halved = false;
  bool gauss = false;
};
cudaError_t eq_group_idft(const GroupIdftParams& p, int elem_bytes, bool bf16, cudaStream_t stream);

}  // namespace flash_eqlinear
