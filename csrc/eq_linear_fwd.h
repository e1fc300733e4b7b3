// Fused p4 (T = 4) EQ-Linear forward: y = IDFT(DFT(x) . planes) + bias.
//
// Torch-free on purpose: this header and the kernels compile with plain nvcc.
//
// Layouts (all tensors contiguous, row-major):
//   x      (M, c, 4)  interleaved input, group index fastest (flat channel ci*4 + g).
//   planes (4, d, c)  orthonormal frequency planes in the order P0, PR, PI, P2 with
//                     P0 = (w0+w1+w2+w3)/2, PR = (w0-w2)/sqrt2, PI = (w1-w3)/sqrt2,
//                     P2 = (w0-w1+w2-w3)/2 for the group-domain weight w (d, c, 4).
//   bias   (d,)       shared by the 4 group copies, or nullptr.
//   y      (M, d, 4)  interleaved output.
// All four tensors share one element type (float, __half or __nv_bfloat16); accumulation is FP32.
//
// Math (per row n, input channel ci, output channel o; conventions in README 'Layout convention'):
//   f0 = x0+x1+x2+x3   fR = x0-x2   fI = x3-x1   f2 = x0-x1+x2-x3
//   a0 = f0 P0^T  a2 = f2 P2^T  aR = fR PR^T - fI PI^T  aI = fR PI^T + fI PR^T
//   y0 = a0/2 + a2/2 + h aR   y1 = a0/2 - a2/2 - h aI
//   y2 = a0/2 + a2/2 - h aR   y3 = a0/2 - a2/2 + h aI   (h = sqrt2/2), + bias[o].
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flash_eqlinear {

struct FwdParams {
  const void* x;
  const void* planes;
  const void* bias;  // may be nullptr
  void* y;
  int64_t M;         // rows (any M >= 0)
  int64_t c;         // input channels per group copy (>= 1)
  int64_t d;         // output channels per group copy (>= 1)
  // Optional, the fp16 / bf16 Hopper kernel only (eq_linear_fwd_sm90.h): x's Fourier planes as column
  // blocks (M, 4c) = [f0 | f2 | fR | fI] * xf_scale, written as a by-product (16-byte aligned).
  void* xf = nullptr;
  float xf_scale = 1.f;
  // Optional with xf: f0's column sums in FP32 before rounding, per 128-row tile and writer warp:
  // (eq_linear_fwd_sm90_sum_rows(M), c) partial sums whose column sums are those of f0 (grad_bias from
  // grad_y's planes, without the planes' rounding).
  float* xf_sums = nullptr;
  // Optional, the fp16 / bf16 kernels (Hopper and mma.sync) and the TF32 Hopper kernel (the exact FP32
  // and narrow launchers return cudaErrorNotSupported when set): y = GELU(result), GELU(v) = v Phi(v)
  // (the exact, erf form) of the result rounded to y's dtype, as GELU applied to the stored result
  // computes it.
  bool gelu = false;
  // Optional, the fp16 / bf16 kernels (Hopper and mma.sync; the exact FP32 and narrow launchers return
  // cudaErrorNotSupported when set): y is FP32 (M, d, 4), the result unrounded, while x, planes and bias
  // are fp16 / bf16 (grad_x of an FP32 input that autocast runs in 16 bits). Not with xf or gelu.
  bool y_f32 = false;
  // Optional, the fp16 / bf16 Hopper kernel (the other launchers return cudaErrorNotSupported when either
  // is not 1): x and / or y in parts, column blocks of whole channels held by separate tensors, so that a
  // layer's output can go straight to several consumers (an attention's q, k, v) and its backward reads
  // their gradients where they are. x_parts (1 .. 3): x is [x | x1 | x2] (each (M, c / x_parts, 4),
  // contiguous, 16-byte aligned), c / x_parts a multiple of the kernel's k tile (32 channels); y_parts
  // (1 .. 3): y is [y | y1 | y2] (each (M, d / y_parts, 4)), d / y_parts a multiple of 64. Where these
  // do not hold, the Hopper launcher launches nothing.
  int x_parts = 1;
  const void* x1 = nullptr;
  const void* x2 = nullptr;
  int y_parts = 1;
  void* y1 = nullptr;
  void* y2 = nullptr;
};

// One launch; returns the launch error (cudaSuccess when nothing went wrong). M == 0 is a no-op.
// Element type: float (exact FP32 SIMT), __half, __nv_bfloat16 (mma.sync tensor cores, FP32 accumulation;
// the Hopper kernel is eq_linear_fwd_sm90.h's).
cudaError_t eq_linear_fwd_fp32(const FwdParams& p, cudaStream_t stream);
cudaError_t eq_linear_fwd_fp16(const FwdParams& p, cudaStream_t stream);
cudaError_t eq_linear_fwd_bf16(const FwdParams& p, cudaStream_t stream);

}  // namespace flash_eqlinear
