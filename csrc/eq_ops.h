// The registered ops' C++ entry points (eq_ops.cpp registers them), grouped by the file that holds them,
// and the host pieces those files share.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "eq_linear_plan.h"

namespace flash_eqlinear {

// ---- eq_linear_fwd_api.cpp: the 2-D forward ops ----
// The forward ops' checks (`what` names the op); returns the bias made contiguous, or undefined for None.
at::Tensor checked_fwd_args(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias,
                            const char* what);
// The plan's kernel for a forward of x (M, 4c) -> (M, 4d) on x's device (y: the output's address, if known).
FwdChoice forward_choice(const at::Tensor& x, int64_t M, int64_t c, int64_t d, const void* y = nullptr);
// The forward ops' shared body (gelu: GELU epilogue; f32_out: FP32 y of 16-bit inputs).
at::Tensor fwd(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias, bool gelu,
               const char* what, bool f32_out = false);
at::Tensor eq_linear_fwd(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias);
at::Tensor eq_linear_fwd_gelu(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> eq_linear_fwd_cast(const at::Tensor& x, const at::Tensor& planes,
                                                      const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> eq_linear_fwd_xf(const at::Tensor& x, const at::Tensor& planes,
                                                    const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eq_linear_fwd_split3(const at::Tensor& x,
                                                                              const at::Tensor& planes,
                                                                              const std::optional<at::Tensor>& bias);

// ---- eq_linear_t_api.cpp: the layer for group sizes 2 and 8 (GEMM form), forward and backward ----
at::Tensor eq_linear_fwd_t(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_t(const at::Tensor& grad_y, const at::Tensor& x,
                                                               const at::Tensor& planes, bool needs_x,
                                                               bool needs_p, bool needs_b);

// ---- eq_group_planes_api.cpp: a group-domain weight's planes and the adjoint (SwappedEQLinear), with autograd ----
at::Tensor group_planes(const at::Tensor& w, const at::Tensor& basis, std::optional<at::ScalarType> dtype);
at::Tensor group_planes_cuda(const at::Tensor& w, const at::Tensor& basis, std::optional<at::ScalarType> dtype);
at::Tensor group_planes_autograd(const at::Tensor& w, const at::Tensor& basis, std::optional<at::ScalarType> dtype);
at::Tensor group_planes_adjoint(const at::Tensor& g, const at::Tensor& basis, at::ScalarType dtype);
at::Tensor group_planes_adjoint_cuda(const at::Tensor& g, const at::Tensor& basis, at::ScalarType dtype);

// ---- eq_linear_bwd_api.cpp: the backward ops ----
std::tuple<at::Tensor, at::Tensor> eq_linear_bwd_weight(const at::Tensor& x, const at::Tensor& grad_y);
std::tuple<at::Tensor, at::Tensor> eq_group_dft_op(const at::Tensor& t, bool input, bool sum);
// The backward ops' checks: grad_y (M, 4d / parts), t (M, 4c) (named tname), planes (4, d, c).
void check_bwd_args(const at::Tensor& grad_y, const at::Tensor& t, const at::Tensor& planes, const char* what,
                    const char* tname, int64_t parts = 1);
// The backward ops' shared body (kept: t holds x's planes from eq_linear_fwd_xf).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& grad_y, const at::Tensor& t,
                                                   const at::Tensor& planes, bool needs_x, bool needs_p, bool needs_b,
                                                   bool kept, bool gx_f32);
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd(const at::Tensor& grad_y, const at::Tensor& x,
                                                             const at::Tensor& planes, bool needs_x, bool needs_p,
                                                             bool needs_b, bool grad_x_fp32);
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_xf(const at::Tensor& grad_y, const at::Tensor& xf,
                                                                const at::Tensor& planes, bool needs_x, bool needs_p,
                                                                bool needs_b);
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_split3(const at::Tensor& gy0, const at::Tensor& gy1,
                                                                    const at::Tensor& gy2, const at::Tensor& x,
                                                                    const at::Tensor& planes, bool needs_x,
                                                                    bool needs_p, bool needs_b, bool grad_x_fp32);

// ---- eq_linear_autograd.cpp: the layer op (any leading dims; autograd and autocast below Python) ----
at::Tensor eq_linear_cuda(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias,
                          bool x_rounded);
at::Tensor eq_linear_autograd(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias,
                              bool x_rounded);
at::Tensor eq_linear_autocast(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias,
                              bool x_rounded);
std::vector<at::Tensor> eq_linear_chunks_cuda(const at::Tensor& x, const at::Tensor& planes,
                                              const std::optional<at::Tensor>& bias, int64_t chunks, bool x_rounded);
std::vector<at::Tensor> eq_linear_chunks_autograd(const at::Tensor& x, const at::Tensor& planes,
                                                  const std::optional<at::Tensor>& bias, int64_t chunks,
                                                  bool x_rounded);
std::vector<at::Tensor> eq_linear_chunks_autocast(const at::Tensor& x, const at::Tensor& planes,
                                                  const std::optional<at::Tensor>& bias, int64_t chunks,
                                                  bool x_rounded);
// The layer on a group-domain weight (d, c, T) or (d, 1, c, T) and bias (d,) or (d, 1): its planes made by
// group_planes (in `dtype`, autocast's where it runs), then eq_linear or, with chunks, eq_linear_chunks.
std::vector<at::Tensor> eq_linear_group(const at::Tensor& x, const at::Tensor& weight,
                                        const std::optional<at::Tensor>& bias, const at::Tensor& basis,
                                        std::optional<at::ScalarType> dtype, std::optional<int64_t> chunks,
                                        bool x_rounded);
std::vector<at::Tensor> eq_linear_group_autocast(const at::Tensor& x, const at::Tensor& weight,
                                                 const std::optional<at::Tensor>& bias, const at::Tensor& basis,
                                                 std::optional<at::ScalarType> dtype, std::optional<int64_t> chunks,
                                                 bool x_rounded);
// The plan of a call, as explain_layer writes it (flash_eqlinear.explain).
std::string eq_linear_plan_op(int64_t M, int64_t c, int64_t d, at::ScalarType dtype, bool x_fp32, at::Device device,
                              bool needs_x, bool needs_p, bool needs_b, int64_t chunks);

// ---- eq_group_layer_norm_api.cpp ----
// The forward's autograd kernel (its node and backward in C++).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_layer_norm_fwd_autograd(const at::Tensor& x,
                                                                             const at::Tensor& weight,
                                                                             const at::Tensor& bias, double eps,
                                                                             at::ScalarType out_dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_layer_norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                                    const at::Tensor& bias, double eps,
                                                                    at::ScalarType out_dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_layer_norm_bwd(const at::Tensor& grad_y, const at::Tensor& x,
                                                                    const at::Tensor& weight, const at::Tensor& mean,
                                                                    const at::Tensor& rstd, bool needs_x,
                                                                    bool needs_wb);

}  // namespace flash_eqlinear
