// Host algorithms of the p4 layer (eq_linear_host.cpp): each takes checked, contiguous tensors of one
// CUDA device and writes or returns its results; none decides a path (eq_linear_plan.h does).
#pragma once

#include <tuple>

#include <ATen/ATen.h>

#include "eq_host_common.h"

namespace flash_eqlinear {

// [[PR, -PI], [PI, PR]] (2d, 2c) of planes (4, d, c): the complex plane product as one real GEMM.
at::Tensor complex_block(const at::Tensor& p);
// (P0, PR, (PI - PR) / 2, (PR + PI) / 2, P2) (5, d, c) of contiguous planes (4, d, c): three products.
at::Tensor gauss_planes(const at::Tensor& pc);
// y = inverse DFT of the FP32 column blocks a + bias (halved, gauss: eq_group_dft.h); `what` names the caller.
void inverse_dft_into(const at::Tensor& a, const at::Tensor& bias, at::Tensor& y, const char* what,
                      bool halved = false, bool gauss = false);
// out = a b (mm or bmm) with FP32 output.
void gemm_fp32_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);
// The plane products of f (the input's Fourier column blocks) and planes as cuBLAS GEMMs, then the
// inverse DFT into y (adjoint: grad_x's products; gauss: three products; cblock: complex_block(planes)).
void fourier_products_into(const at::Tensor& f, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                           const char* what, bool adjoint = false, bool gauss = false,
                           const at::Tensor& cblock = at::Tensor());
// Group DFT of t (M, 4n) into Fourier planes (blocks: column blocks), with optional FP32 column sums of f0.
std::tuple<at::Tensor, at::Tensor> group_dft(const at::Tensor& t, bool input, bool blocks, bool sum,
                                             const char* what, bool halve = false, bool gauss = false);
// The forward's GEMM form into y; returns x's planes [f0 | f2 | fR | fI] / 2.
at::Tensor fwd_gemm_form(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                         const char* what, bool gauss = false, const at::Tensor& cblock = at::Tensor());
// Rows per chunk of the GEMM forms' row-chunked passes for row_bytes of workspace per row.
int64_t gemm_form_chunk_rows(int64_t row_bytes);
// The inference forward's GEMM form in row chunks.
void fwd_gemm_form_chunked(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                           const char* what, bool gauss);
// fp16 / bf16 through the sm_90a forward kernel (optional outputs: x's planes and f0's partial sums, GELU,
// inputs and outputs in parts); false where the launcher declines (nothing launched).
bool fwd_sm90_16bit(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                    const at::Tensor& xf = at::Tensor(), float xf_scale = 1.f, const at::Tensor& xf_sums = at::Tensor(),
                    bool gelu = false, at::TensorList x_more = {}, at::TensorList y_more = {});
// FP32 as split-TF32 GEMMs over x's planes (FLASH_EQLINEAR_FP32=3xtf32), into y.
void eq_linear_fwd_3xtf32(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y);
// The fused weight gradient (grad_planes, grad_bias); optionally the adjoint planes and grad_y in parts.
std::tuple<at::Tensor, at::Tensor> weight_grads(const at::Tensor& x, const at::Tensor& grad_y,
                                                const at::Tensor* adj_of = nullptr, at::Tensor* adj = nullptr,
                                                at::TensorList gy_more = {}, bool* unsupported = nullptr);
// The adjoint planes (4, c, d) of planes (4, d, c).
at::Tensor adjoint_planes(const at::Tensor& planes);
// The GEMM form of the backward from grad_y's planes (made here unless gf_made).
void bwd_from_planes(const at::Tensor& gy, const at::Tensor& gf_made, const at::Tensor& g0_sums,
                     const at::Tensor& t, bool kept, const at::Tensor& planes, bool gx_gemm, bool needs_p,
                     bool needs_b, at::Tensor& gx, at::Tensor& gp, at::Tensor& gb);

}  // namespace flash_eqlinear
