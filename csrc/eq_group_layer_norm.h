// Group LayerNorm for T = 4: LayerNorm over each row's C = 4c channels with affine parameters shared by
// the 4 group copies of a field (flash_eqlinear.GroupLayerNorm; flash_eqlinear bindings).
//
// Torch-free on purpose: this header and the kernels compile with plain nvcc.
//
//   x (M, c, 4) interleaved, contiguous (row stride 4c), 16-byte aligned (float) / 8-byte (16-bit)
//   weight, bias (c,) FP32
//   y[m, o, g] = (x[m, o, g] - mean[m]) * rstd[m] * weight[o] + bias[o]
//   mean (M,), rstd (M,) FP32: rstd = 1 / sqrt(var + eps), var the biased variance over the row's 4c values
//
// One warp per row, the row held in registers (c <= kMaxFields): two passes over the registers for mean and
// variance, FP32 arithmetic, one rounding per stored value. x, y (and grad_y / grad_x in the backward):
// float, __half or __nv_bfloat16; y's type may differ from x's only for an FP32 x (a LayerNorm that writes
// the autocast dtype the next layer reads: one pass over the activations less than LayerNorm + cast).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flash_eqlinear {

constexpr int kGroupLayerNormMaxFields = 512;  // c <= 512: C <= 2048 channels per row

enum class ElemType : int { kFloat = 0, kHalf = 1, kBFloat16 = 2 };

struct GroupLayerNormFwdParams {
  const void* x;
  void* y;
  const float* weight;
  const float* bias;
  float* mean;
  float* rstd;
  int64_t M;
  int c;
  float eps;
};

// cudaErrorInvalidValue for sizes out of range, misaligned pointers or an unsupported type pair.
cudaError_t eq_group_layer_norm_fwd(const GroupLayerNormFwdParams& p, ElemType x_type, ElemType y_type,
                                    cudaStream_t stream);

// Backward: grad_x = rstd * (gw - mean_row(gw) - xhat * mean_row(gw * xhat)) with xhat = (x - mean) * rstd
// and gw = grad_y * weight[o]; grad_weight[o] = sum over rows and the 4 copies of grad_y * xhat, grad_bias[o]
// the same of grad_y. The parameter gradients come as per-block partial sums: partials (2, blocks, c) FP32,
// [0] for the weight, [1] for the bias, which the caller sums over blocks (in a fixed order: deterministic).
// grad_y has y's type, grad_x x's; grad_x may be nullptr (parameter gradients only), partials nullptr (grad_x
// only). Rows are dealt to the blocks' warps in a fixed order.
struct GroupLayerNormBwdParams {
  const void* grad_y;
  const void* x;
  const float* weight;
  const float* mean;
  const float* rstd;
  void* grad_x;
  float* partials;
  int64_t M;
  int c;
  int blocks;  // eq_group_layer_norm_bwd_blocks(M, c, x type, y type, sm_count)
};

int eq_group_layer_norm_bwd_blocks(int64_t M, int c, ElemType x_type, ElemType y_type, int sm_count);

cudaError_t eq_group_layer_norm_bwd(const GroupLayerNormBwdParams& p, ElemType x_type, ElemType y_type,
                                    cudaStream_t stream);

}  // namespace flash_eqlinear
