// The backward ops (registered in eq_ops.cpp): argument checks, and the backward that follows the plan
// (eq_linear_plan.h): the fused weight gradient with grad_x by the forward's kernels on the adjoint
// planes, or the GEMM form from the group DFTs of grad_y and x.
#include <tuple>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "eq_host_common.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_linear_host.h"
#include "eq_ops.h"

namespace flash_eqlinear {

std::tuple<at::Tensor, at::Tensor> eq_linear_bwd_weight(const at::Tensor& x, const at::Tensor& grad_y) {
  return weight_grads(x, grad_y);
}

// Group DFT into Fourier planes: t (M, 4n) -> (4, M, n) in the x (input=True) or grad_y layout of
// eq_group_dft.h. With sum, also the FP32 column sums (n,) of x0+x1+x2+x3 over the rows (for grad_y:
// grad_bias), reduced in a fixed order; else an empty (0,).
std::tuple<at::Tensor, at::Tensor> eq_group_dft_op(const at::Tensor& t, bool input, bool sum) {
  TORCH_CHECK(t.is_cuda(), "eq_group_dft: expected a CUDA tensor, got one on ", t.device().str());
  TORCH_CHECK(t.dim() == 2 && t.size(1) % 4 == 0 && t.size(1) > 0,
              "eq_group_dft: expected a 2-D (M, 4n) tensor, got ", shape(t.sizes()));
  const auto dtype = t.scalar_type();
  TORCH_CHECK(kernel_dtype(dtype), "eq_group_dft: dtype must be float32, float16 or bfloat16, got ",
              c10::toString(dtype));
  const at::cuda::CUDAGuard guard(t.device());
  at::Tensor src = t.contiguous();
  if (reinterpret_cast<uintptr_t>(src.data_ptr()) % (4 * src.element_size()) != 0) src = src.clone();
  auto [planes, sums] = group_dft(src, input, false, sum, "eq_group_dft");
  return {planes, sum ? sums.sum(0) : sums};
}


// The plan of a backward with grad_y (M, 4d) like g and planes (4, d, c).
LayerPlan backward_plan(const at::Tensor& g, int64_t M, int64_t c, int64_t d, bool needs_x, bool needs_p,
                        bool needs_b) {
  LayerQuery q;
  q.M = M, q.c = c, q.d = d;
  q.elem = elem_of(g.scalar_type());
  q.sm_major = sm_major_of(g);
  q.tf32 = tf32_allowed();
  q.needs_x = needs_x, q.needs_p = needs_p, q.needs_b = needs_b;
  return plan_layer(q);
}

// grad_x (M, 4c) of grad_y (M, 4d): the forward's kernels on the adjoint planes (made unless adj_made). With
// f32 (fp16 / bf16 grad_y), grad_x is FP32 (fwd's f32_out).
at::Tensor grad_x_kernel(const at::Tensor& gy, const at::Tensor& planes, bool f32, const at::Tensor& adj_made) {
  const at::Tensor adj = adj_made.defined() ? adj_made : adjoint_planes(planes);
  return fwd(gy, adj, std::nullopt, false, "eq_linear_fwd", f32);
}

// grad_x (M, 4c) of 16-bit grad_y (M, 4d) by the Hopper kernel on the adjoint planes (GradXPath::kHopperPlanes);
// with gf, that kernel also writes grad_y's planes [g0 | g2 | gR | gI] (M, 4d) into *gf and g0's partial
// column sums in FP32 into *g0_sums, for the GEMM-form weight gradient. Undefined where the launcher declines
// (then the GEMM form computes grad_x from grad_y's planes).
at::Tensor grad_x_hopper_planes(const at::Tensor& gy, const at::Tensor& planes, at::Tensor* gf, at::Tensor* g0_sums) {
  const int64_t M = gy.size(0), c = planes.size(2), d = planes.size(1);
  const at::Tensor adj = adjoint_planes(planes);
  at::Tensor gx = at::empty({M, 4 * c}, gy.options());
  const bool write = gf != nullptr && M > 0;
  const at::Tensor planes_out = write ? at::empty_like(gy, at::MemoryFormat::Contiguous) : at::Tensor();
  const at::Tensor sums = write ? at::empty({eq_linear_fwd_sm90_sum_rows(M), d}, gy.options().dtype(at::kFloat))
                                : at::Tensor();
  if (!fwd_sm90_16bit(gy, adj, at::Tensor(), gx, planes_out, 1.f, sums)) return at::Tensor();
  if (write) std::tie(*gf, *g0_sums) = std::make_tuple(planes_out, sums);
  return gx;
}

// The backward ops' argument checks: grad_y (M, 4d), t (M, 4c) (x or its planes, named tname) and planes
// (4, d, c), on one CUDA device, of one dtype among float32, float16, bfloat16; `what` names the op. With
// parts > 1, grad_y is one of that many column blocks (M, 4d / parts).
void check_bwd_args(const at::Tensor& grad_y, const at::Tensor& t, const at::Tensor& planes, const char* what,
                    const char* tname, int64_t parts) {
  const std::string op = what;
  TORCH_CHECK(planes.dim() == 3 && planes.size(0) == 4, op, ": planes must have shape (4, d, c), got ",
              shape(planes.sizes()));
  const int64_t d = planes.size(1), c = planes.size(2);
  TORCH_CHECK(d % parts == 0, op, ": d = ", num(d), " output channels per group copy do not split into ",
              num(parts), " parts");
  const int64_t gw = 4 * d / parts;
  TORCH_CHECK(t.dim() == 2 && grad_y.dim() == 2 && t.size(0) == grad_y.size(0) && t.size(1) == 4 * c &&
                  grad_y.size(1) == gw,
              op, ": want grad_y", parts > 1 ? " parts" : "", " (M, ", num(gw), "), ", tname, " (M, ", num(4 * c),
              ") for planes ", shape(planes.sizes()), ", got ", shape(grad_y.sizes()), ", ", shape(t.sizes()));
  TORCH_CHECK(grad_y.is_cuda() && t.device() == grad_y.device() && planes.device() == grad_y.device(), op,
              ": grad_y, ", tname, " and planes must be on one CUDA device, got ", grad_y.device().str(), ", ",
              t.device().str(), ", ", planes.device().str());
  const auto dtype = grad_y.scalar_type();
  TORCH_CHECK(kernel_dtype(dtype) && t.scalar_type() == dtype && planes.scalar_type() == dtype, op, ": grad_y, ",
              tname, " and planes must share one dtype (float32, float16 or bfloat16), got ",
              c10::toString(dtype), ", ", c10::toString(t.scalar_type()), ", ", c10::toString(planes.scalar_type()));
}

// The backward ops' shared body, by the plan: t is x, or with kept x's planes from eq_linear_fwd_xf (then
// the weight gradient's GEMM form). With gx_f32 (fp16 / bf16), grad_x is FP32 (grad_x_kernel; the GEMM
// forms widen theirs).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& grad_y, const at::Tensor& t,
                                                   const at::Tensor& planes, bool needs_x, bool needs_p, bool needs_b,
                                                   bool kept, bool gx_f32) {
  const int64_t M = grad_y.size(0), d = planes.size(1), c = planes.size(2);
  const at::cuda::CUDAGuard guard(grad_y.device());
  check_device_supported(grad_y);
  const at::Tensor gy = grad_y.contiguous();
  at::Tensor gx, gp, gb;  // undefined until computed; or_empty for the ones not needed
  const auto out = [&]() -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
    const at::Tensor x_out = gx_f32 && needs_x ? gx.to(at::kFloat) : gx;
    return {or_empty(x_out, gy.options()), or_empty(gp, gy.options()), or_empty(gb, gy.options())};
  };
  const LayerPlan plan = backward_plan(gy, M, c, d, needs_x, needs_p, needs_b);
  const bool gemm = kept || plan.wgrad == WeightGrad::kGemm;
  if (!gemm && (needs_p || needs_b)) {
    // The fused weight gradient first: its reduce kernel also makes grad_x's adjoint planes (one launch less).
    at::Tensor adj;
    const at::Tensor pc = planes.contiguous();
    auto [p, b] = needs_x ? weight_grads(t, gy, &pc, &adj) : weight_grads(t, gy);
    if (needs_x) gx = grad_x_kernel(gy, planes, gx_f32, adj);
    if (needs_p) gp = p;
    if (needs_b) gb = b;
    return out();
  }
  bool gx_gemm = false;
  at::Tensor gf, g0_sums;  // grad_y's planes, if grad_x's kernel writes them for the GEMM-form weight gradient
  if (needs_x) {
    switch (plan.gradx) {
      case GradXPath::kGemm: gx_gemm = true; break;
      case GradXPath::kHopperPlanes:
        gx = grad_x_hopper_planes(gy, planes, gemm && needs_p ? &gf : nullptr, &g0_sums);
        gx_gemm = !gx.defined();  // declined: the GEMM form
        break;
      default: gx = grad_x_kernel(gy, planes, gx_f32, at::Tensor()); break;
    }
  }
  if (!needs_p && !needs_b && !gx_gemm) return out();
  if (!needs_p && !gx_gemm) {
    gb = gy.sum(0, false, at::kFloat).view({d, 4}).sum(1).to(gy.scalar_type());
    return out();
  }
  bwd_from_planes(gy, gf, g0_sums, t, kept, planes, gx_gemm, needs_p, needs_b, gx, gp, gb);
  return out();
}

// The whole backward in one op: grad_y (M, 4d), x (M, 4c), planes (4, d, c) -> (grad_x (M, 4c), grad_planes
// (4, d, c), grad_bias (d,)), each an empty (0,) tensor when not needed, by the plan (bwd). Workspace of the
// GEMM form: grad_y's planes (M, 4d) and x's (M, 4c) in their dtype, and for the GEMM-form grad_x an (M, 4c)
// FP32 buffer of plane products. grad_x_fp32: grad_x in FP32 (fp16 / bf16 tensors: the backward of
// eq_linear_fwd_cast, whose input is FP32).
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd(const at::Tensor& grad_y, const at::Tensor& x,
                                                             const at::Tensor& planes, bool needs_x, bool needs_p,
                                                             bool needs_b, bool grad_x_fp32) {
  check_bwd_args(grad_y, x, planes, "eq_linear_bwd", "x");
  return bwd(grad_y, x, planes, needs_x, needs_p, needs_b, false, grad_x_fp32);
}

// The backward of eq_linear_fwd_xf: eq_linear_bwd's GEMM form with x's planes xf (M, 4c) = [f0 | f2 | fR
// | fI] / 2 as that op returned them, in place of x (no group DFT of x).
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_xf(const at::Tensor& grad_y, const at::Tensor& xf,
                                                                const at::Tensor& planes, bool needs_x, bool needs_p,
                                                                bool needs_b) {
  check_bwd_args(grad_y, xf, planes, "eq_linear_bwd_xf", "xf");
  return bwd(grad_y, xf, planes, needs_x, needs_p, needs_b, true, false);
}

// The backward of eq_linear_fwd_split3, grad_y
// given as its three parts gy0, gy1, gy2 (M, 4d / 3): the Hopper kernels read them where they are; elsewhere
// they are joined first. x as the forward's kernel took it (x_low where it rounded x).
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_split3(const at::Tensor& gy0, const at::Tensor& gy1,
                                                                    const at::Tensor& gy2, const at::Tensor& x,
                                                                    const at::Tensor& planes, bool needs_x,
                                                                    bool needs_p, bool needs_b, bool grad_x_fp32) {
  const char* what = "eq_linear_bwd_split3";
  for (const at::Tensor* g : {&gy0, &gy1, &gy2}) check_bwd_args(*g, x, planes, what, "x", 3);
  const int64_t M = x.size(0), c = planes.size(2), d = planes.size(1);
  const at::cuda::CUDAGuard guard(gy0.device());
  check_device_supported(gy0);
  // contiguous, 16-byte aligned (the Hopper kernels' TMA)
  const at::Tensor g0 = aligned16(gy0.contiguous()), g1 = aligned16(gy1.contiguous()),
                   g2 = aligned16(gy2.contiguous());
  at::Tensor gy;  // the parts joined, where a kernel needs that
  const auto joined = [&]() -> const at::Tensor& {
    if (!gy.defined()) gy = at::cat({g0, g1, g2}, 1);
    return gy;
  };
  // Where the plan takes the GEMM form for the weight or grad_x, or another kernel than the Hopper one for
  // grad_x, the parts are joined and go through bwd.
  const LayerPlan plan = backward_plan(g0, M, c, d, needs_x, needs_p, needs_b);
  if (((needs_p || needs_b) && plan.wgrad == WeightGrad::kGemm) || (needs_x && plan.gradx != GradXPath::kKernel)) {
    const auto [gx, gp, gb] = bwd(joined(), x, planes, needs_x, needs_p, needs_b, false, grad_x_fp32);
    return {gx, gp, gb};
  }
  at::Tensor gx, gp, gb, adj;  // undefined until computed; or_empty for the ones not needed
  const at::Tensor pc = planes.contiguous();
  if (needs_p || needs_b) {  // first, as in bwd: its reduce kernel makes grad_x's adjoint planes
    bool unsupported = false;
    auto grads = weight_grads(x, g0, needs_x ? &pc : nullptr, needs_x ? &adj : nullptr, {g1, g2}, &unsupported);
    if (unsupported) grads = weight_grads(x, joined(), needs_x ? &pc : nullptr, needs_x ? &adj : nullptr);
    if (needs_p) gp = std::get<0>(grads);
    if (needs_b) gb = std::get<1>(grads);
  }
  if (needs_x) {
    const bool f32 = grad_x_fp32 && g0.scalar_type() != at::kFloat;
    bool done = false;
    if (plan.gradx_fwd == FwdPath::kHopper16) {
      if (!adj.defined()) adj = adjoint_planes(pc);
      gx = at::empty({M, 4 * c}, g0.options().dtype(f32 ? at::kFloat : g0.scalar_type()));
      done = fwd_sm90_16bit(g0, adj, at::Tensor(), gx, at::Tensor(), 1.f, at::Tensor(), false, {g1, g2});
    }
    if (!done) gx = grad_x_kernel(joined(), planes, f32, adj);
    if (grad_x_fp32) gx = gx.to(at::kFloat);
  }
  return {or_empty(gx, g0.options()), or_empty(gp, g0.options()), or_empty(gb, g0.options())};
}


}  // namespace flash_eqlinear
