// Fused p4 (T = 4) EQ-Linear backward for the weight: grad_planes and grad_bias straight from the
// original x and grad_y (no Fourier copies of either in global memory).
//
// Torch-free on purpose: this header and the kernels compile with plain nvcc.
//
// Layouts (all tensors contiguous, row-major, one element type: fp32, fp16 or bf16):
//   x            (M, c, 4)  the forward's input, interleaved (flat channel ci*4 + g).
//   gy           (M, d, 4)  grad of the forward's output y, interleaved.
//   grad_planes  (4, d, c)  written in plane order P0, PR, PI, P2 (see eq_linear_fwd.h).
//   grad_bias    (d,)       written when not nullptr.
//
// Math (per row m; f = transform of x[m, ci, :], g = transform of gy[m, o, :]):
//   f0 = x0+x1+x2+x3   fR = x0-x2   fI = x3-x1   f2 = x0-x1+x2-x3   (same for g from gy)
//   grad_P0[o,ci] = 1/2     sum_m g0 f0         grad_P2[o,ci] = 1/2 sum_m g2 f2
//   grad_PR[o,ci] = 1/sqrt2 sum_m (gR fR + gI fI)
//   grad_PI[o,ci] = 1/sqrt2 sum_m (gI fR - gR fI)
//   grad_bias[o]  = sum_m g0[m, o]  (= grad_y summed over rows and the 4 group copies)
// FP32: exact (FFMA, no TF32). fp16 / bf16: tensor cores (wgmma on Hopper GPUs where
// eq_linear_bwd_weight_sm90.h allows it, mma.sync elsewhere), the transforms in FP32 and rounded once
// to the element type, FP32 accumulation, grad_bias summed in FP32.
// Deterministic: the reduction over M is split into S chunks whose FP32 partial tiles go to a
// workspace and are summed in a fixed order by a second kernel (eq_linear_bwd_weight_split.cuh).
// S is a pure function of (M, c, d, device), so results are bitwise reproducible on a given GPU
// model (but may differ in the last bits between GPU models). FP32 with S == 1 writes
// grad_planes / grad_bias directly and uses no workspace; fp16 / bf16 always use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace flash_eqlinear {

struct BwdWeightParams {
  const void* x;          // (M, c, 4)
  const void* gy;         // (M, d, 4)
  void* grad_planes;      // (4, d, c), overwritten
  void* grad_bias;        // (d,), overwritten; nullptr = not needed
  void* workspace;        // 16-byte aligned, >= eq_linear_bwd_weight_workspace_bytes(...); may be
                          // nullptr when that size is 0
  size_t workspace_bytes;
  int64_t M;              // rows (any M >= 0; M == 0 writes zeros)
  int64_t c;              // input channels per group copy (>= 1)
  int64_t d;              // output channels per group copy (>= 1)
  // Optional, for the grad_x that follows: with both set, the launch also writes adj (4, c, d), the adjoint
  // planes of planes (4, d, c) (eq_adjoint_planes), in spare blocks of the reduce kernel where one runs.
  const void* planes = nullptr;
  void* adj = nullptr;
  // Optional, fp16 / bf16 where the Hopper kernel runs (else cudaErrorNotSupported, nothing launched):
  // grad_y in gy_parts (1 .. 3) column blocks of whole channels held by separate tensors, [gy | gy1 | gy2],
  // each (M, d / gy_parts, 4), contiguous and 16-byte aligned (the gradients of a layer whose output went
  // to several consumers, e.g. an attention's q, k, v, read where they are). d / gy_parts must be a
  // multiple of 64 (16 where the Hopper kernel keeps grad_y as its A operand).
  int gy_parts = 1;
  const void* gy1 = nullptr;
  const void* gy2 = nullptr;
  // fp16 / bf16: the kernel the plan chose (plan_weight_grad_hopper): the Hopper one (eq_linear_bwd_weight_sm90.h)
  // where set, else mma.sync. Where the build or the device rules the Hopper kernel out, mma.sync runs.
  bool hopper = false;
};

// Workspace (bytes) that eq_linear_bwd_weight_<elem> needs for these sizes on CUDA device `device`
// (the one that will run it: the split depends on its SM count and shared memory); elem_bytes is 4
// (fp32) or 2 (fp16 / bf16); hopper: BwdWeightParams::hopper. 0 means none. Returns 0 as well when the device query fails; the
// launch then reports the error.
size_t eq_linear_bwd_weight_workspace_bytes(int64_t M, int64_t c, int64_t d, int elem_bytes, int device,
                                            bool hopper);
// The FP32 part of the query, for a GPU with sm_count SMs.
size_t eq_linear_bwd_weight_fp32_workspace_bytes(int64_t M, int64_t c, int64_t d, int sm_count);

// One or two launches on `stream`, on the current device; returns the first error (cudaSuccess when
// nothing went wrong). cudaErrorInvalidValue for bad sizes, null tensors, or a workspace that is
// too small or not 16-byte aligned. FP32: x, gy and grad_planes may have any 4-byte alignment (a
// scalar path handles pointers that are not 16-byte aligned). fp16 / bf16: x and gy must be
// 16-byte aligned, grad_planes and grad_bias 2-byte aligned.
cudaError_t eq_linear_bwd_weight_fp32(const BwdWeightParams& p, cudaStream_t stream);
cudaError_t eq_linear_bwd_weight_fp16(const BwdWeightParams& p, cudaStream_t stream);
cudaError_t eq_linear_bwd_weight_bf16(const BwdWeightParams& p, cudaStream_t stream);

}  // namespace flash_eqlinear
