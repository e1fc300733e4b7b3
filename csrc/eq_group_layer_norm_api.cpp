// The group LayerNorm's ops (eq_group_layer_norm.h; registered in eq_ops.cpp): checks, allocation, launch, and
// the forward's autograd formula (Autograd key), so that an eager norm's node and backward run without Python.
// Where its gradients are to be differentiable (create_graph=True), the backward calls
// group_layer_norm_grads_differentiable, whose composite implementation is Python's (flash_eqlinear/layer_norm.py).
#include <tuple>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "eq_group_layer_norm.h"
#include "eq_host_common.h"
#include "eq_ops.h"

namespace flash_eqlinear {
namespace {

ElemType elem_type(at::ScalarType t) {
  return t == at::kFloat ? ElemType::kFloat : t == at::kHalf ? ElemType::kHalf : ElemType::kBFloat16;
}

// The parameters' checks; returns c.
int64_t checked_ln_params(const at::Tensor& x, const at::Tensor& weight, const char* what) {
  const std::string op = what;
  TORCH_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor, got one on ", x.device().str());
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D (M, 4c), got ", shape(x.sizes()));
  TORCH_CHECK(kernel_dtype(x.scalar_type()), op, ": x dtype must be float32, float16 or bfloat16, got ",
              c10::toString(x.scalar_type()));
  TORCH_CHECK(weight.device() == x.device(), op, ": weight is on ", weight.device().str(), " but x on ",
              x.device().str());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) >= 1 && x.size(1) == 4 * weight.size(0), op,
              ": weight must have shape (c,) for x (M, 4c), got weight ", shape(weight.sizes()), " and x ",
              shape(x.sizes()));
  TORCH_CHECK(kernel_dtype(weight.scalar_type()), op, ": weight dtype must be float32, float16 or bfloat16, got ",
              c10::toString(weight.scalar_type()));
  const int64_t c = weight.size(0);
  TORCH_CHECK(c <= kGroupLayerNormMaxFields, op, ": at most ", num(kGroupLayerNormMaxFields),
              " fields (", num(4 * kGroupLayerNormMaxFields), " channels) per row, got c = ", num(c));
  check_device_supported(x);
  return c;
}

using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

struct NormOps {
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::ScalarType)>
      fwd;
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, bool)>
      bwd;
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool, bool)>
      differentiable;
};

const NormOps& norm_ops() {
  static const NormOps o = [] {
    auto& d = c10::Dispatcher::singleton();
    const auto op = [&d](const char* name) { return d.findSchemaOrThrow(name, ""); };
    return NormOps{
        op("flash_eqlinear::group_layer_norm_fwd")
            .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::ScalarType)>(),
        op("flash_eqlinear::group_layer_norm_bwd")
            .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, bool, bool)>(),
        op("flash_eqlinear::group_layer_norm_grads_differentiable")
            .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool, bool)>()};
  }();
  return o;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One node per norm: keeps x, weight and the forward's mean and rstd; mean and rstd are outputs without a
// gradient.
class GroupLayerNormFunction : public torch::autograd::Function<GroupLayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, at::ScalarType out_dtype) {
    const at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = norm_ops().fwd.call(x, weight, bias, eps, out_dtype);
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);  // (no zero gradients made for mean and rstd)
    return {y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool needs_x = ctx->needs_input_grad(0), needs_wb = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor gx, gw, gb;
    if (at::GradMode::is_enabled()) {  // create_graph=True: gradients that are differentiable themselves
      std::tie(gx, gw, gb) = norm_ops().differentiable.call(grads[0], saved[0], saved[1],
                                                            ctx->saved_data["eps"].toDouble(), needs_x, needs_wb);
    } else {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(gx, gw, gb) = norm_ops().bwd.call(grads[0], saved[0], saved[1], saved[2], saved[3], needs_x, needs_wb);
    }
    return {needs_x ? gx : at::Tensor(), ctx->needs_input_grad(1) ? gw : at::Tensor(),
            ctx->needs_input_grad(2) ? gb : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// The forward's autograd kernel: a node where a gradient is recorded, else the CUDA kernel as it is.
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_layer_norm_fwd_autograd(const at::Tensor& x,
                                                                             const at::Tensor& weight,
                                                                             const at::Tensor& bias, double eps,
                                                                             at::ScalarType out_dtype) {
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || bias.requires_grad());
  if (!grad) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return norm_ops().fwd.call(x, weight, bias, eps, out_dtype);
  }
  const variable_list out = GroupLayerNormFunction::apply(x, weight, bias, eps, out_dtype);
  return {out[0], out[1], out[2]};
}

// x (M, 4c) (fp32 / fp16 / bf16), weight and bias (c,) -> y (M, 4c) in out_dtype (x's dtype, or any of the
// three for an FP32 x), mean (M,) and rstd (M,) FP32.
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_layer_norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                                    const at::Tensor& bias, double eps,
                                                                    at::ScalarType out_dtype) {
  const char* op = "group_layer_norm_fwd";
  const int64_t c = checked_ln_params(x, weight, op);
  TORCH_CHECK(bias.device() == x.device() && bias.sizes() == weight.sizes(), op,
              ": bias must have weight's shape (", num(c), ",) and device, got ", shape(bias.sizes()), " on ",
              bias.device().str());
  TORCH_CHECK(kernel_dtype(out_dtype) && (out_dtype == x.scalar_type() || x.scalar_type() == at::kFloat), op,
              ": out_dtype must be x's dtype, or float32 / float16 / bfloat16 for a float32 x; got ",
              c10::toString(out_dtype), " for x of ", c10::toString(x.scalar_type()));
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", std::to_string(eps));
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xs = aligned16(x.contiguous());
  const at::Tensor w = weight.to(at::kFloat).contiguous(), b = bias.to(at::kFloat).contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, 4 * c}, x.options().dtype(out_dtype));
  at::Tensor mean = at::empty({M}, x.options().dtype(at::kFloat)), rstd = at::empty({M}, mean.options());
  GroupLayerNormFwdParams p{xs.data_ptr(), y.data_ptr(), w.data_ptr<float>(), b.data_ptr<float>(),
                            mean.data_ptr<float>(), rstd.data_ptr<float>(), M, int(c), float(eps)};
  const cudaError_t err = eq_group_layer_norm_fwd(p, elem_type(x.scalar_type()), elem_type(out_dtype),
                                                  at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
  return {y, mean, rstd};
}

// grad_y (M, 4c) in y's dtype, x, weight, mean and rstd as the forward took / returned them -> grad_x (M, 4c)
// in x's dtype (needs_x; else (0,)), grad_weight and grad_bias (c,) in weight's dtype (needs_wb; else (0,)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_layer_norm_bwd(const at::Tensor& grad_y, const at::Tensor& x,
                                                                    const at::Tensor& weight, const at::Tensor& mean,
                                                                    const at::Tensor& rstd, bool needs_x,
                                                                    bool needs_wb) {
  const char* op = "group_layer_norm_bwd";
  const int64_t c = checked_ln_params(x, weight, op);
  const int64_t M = x.size(0);
  TORCH_CHECK(grad_y.device() == x.device() && grad_y.sizes() == x.sizes(), op, ": grad_y must have x's shape ",
              shape(x.sizes()), " and device, got ", shape(grad_y.sizes()), " on ", grad_y.device().str());
  TORCH_CHECK(kernel_dtype(grad_y.scalar_type()) &&
                  (grad_y.scalar_type() == x.scalar_type() || x.scalar_type() == at::kFloat),
              op, ": grad_y dtype must be x's, or any of float32 / float16 / bfloat16 for a float32 x; got ",
              c10::toString(grad_y.scalar_type()), " for x of ", c10::toString(x.scalar_type()));
  for (const at::Tensor* t : {&mean, &rstd})
    TORCH_CHECK(t->device() == x.device() && t->scalar_type() == at::kFloat && t->dim() == 1 && t->size(0) == M,
                op, ": mean and rstd must be float32 (", num(M), ",) on x's device, got ", shape(t->sizes()), " ",
                c10::toString(t->scalar_type()));
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor gx, gw, gb;  // undefined until computed; or_empty for the ones not needed
  const auto out = [&]() -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
    return {or_empty(gx, x.options()), or_empty(gw, weight.options()), or_empty(gb, weight.options())};
  };
  if (!needs_x && !needs_wb) return out();
  if (needs_x) gx = at::empty_like(x, at::MemoryFormat::Contiguous);
  const at::Tensor gys = aligned16(grad_y.contiguous()), xs = aligned16(x.contiguous());
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const at::Tensor mc = mean.contiguous(), rc = rstd.contiguous();
  const int blocks = eq_group_layer_norm_bwd_blocks(M, int(c), elem_type(x.scalar_type()),
                                                    elem_type(grad_y.scalar_type()),
                                                    at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  at::Tensor partials = needs_wb ? at::empty({2, blocks, c}, x.options().dtype(at::kFloat)) : at::Tensor();
  GroupLayerNormBwdParams p{gys.data_ptr(),
                            xs.data_ptr(),
                            w.data_ptr<float>(),
                            mc.data_ptr<float>(),
                            rc.data_ptr<float>(),
                            needs_x ? gx.data_ptr() : nullptr,
                            needs_wb ? partials.data_ptr<float>() : nullptr,
                            M,
                            int(c),
                            blocks};
  const cudaError_t err = eq_group_layer_norm_bwd(p, elem_type(x.scalar_type()), elem_type(grad_y.scalar_type()),
                                                  at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
  if (needs_wb) {  // the blocks' partials summed in a fixed order, one fresh tensor each (outputs never alias)
    gw = partials[0].sum(0).to(weight.scalar_type());
    gb = partials[1].sum(0).to(weight.scalar_type());
  }
  return out();
}

}  // namespace flash_eqlinear
