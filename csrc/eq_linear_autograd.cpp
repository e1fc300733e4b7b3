// The layer op flash_eqlinear::eq_linear(x, planes, bias, x_rounded): x (..., 4c) -> (..., 4d) with planes
// (4, d, c) and bias (d,), with its checks, autocast behaviour (AutocastCUDA) and autograd formula
// (Autograd) registered here, below Python: an eager FlashEQLinear call is one dispatcher call, whose
// backward runs in the autograd engine without the interpreter.
//
// The kernels it calls are the 2-D ops (eq_linear_fwd, _cast, _xf, eq_linear_bwd, _bwd_xf), through the
// dispatcher below the autograd key: under tracing (FakeTensor, torch.compile) their fakes run instead.
// Where a gradient is to be differentiable (create_graph=True), the backward calls
// eq_linear_grads_differentiable, whose composite implementation is Python's (flash_eqlinear/_registry.py).
#include <tuple>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include "eq_host_common.h"
#include "eq_ops.h"

namespace flash_eqlinear {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// How the training forward ran, i.e. what its node keeps (TrainForm's autograd cases).
enum Form : int64_t { kPlainForm = 0, kRoundXForm = 1, kKeepPlanesForm = 2 };

struct Ops {
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, bool)> layer;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&)> fwd;
  c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&)>
      cast, xf;
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool, bool, bool)>
      bwd;
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool, bool)> bwd_xf;
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool, bool,
                                   bool)>
      differentiable;
  c10::TypedOperatorHandle<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t,
                                                   bool)>
      chunks;
  c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&,
                                                                                      const at::Tensor&, const OptTensor&)>
      split3;
  c10::TypedOperatorHandle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, bool, bool, bool)>
      bwd_split3;
  c10::TypedOperatorHandle<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&,
                                                   const at::Tensor&, std::optional<at::ScalarType>,
                                                   std::optional<int64_t>, bool)>
      group;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, std::optional<at::ScalarType>)> planes;
};

const Ops& ops() {
  static const Ops o = [] {
    auto& d = c10::Dispatcher::singleton();
    const auto op = [&d](const char* name) { return d.findSchemaOrThrow(name, ""); };
    return Ops{op("flash_eqlinear::eq_linear").typed<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, bool)>(),
               op("flash_eqlinear::eq_linear_fwd").typed<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&)>(),
               op("flash_eqlinear::eq_linear_fwd_cast")
                   .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&)>(),
               op("flash_eqlinear::eq_linear_fwd_xf")
                   .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&)>(),
               op("flash_eqlinear::eq_linear_bwd")
                   .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool, bool, bool)>(),
               op("flash_eqlinear::eq_linear_bwd_xf")
                   .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool, bool)>(),
               op("flash_eqlinear::eq_linear_grads_differentiable")
                   .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool, bool, bool)>(),
               op("flash_eqlinear::eq_linear_chunks")
                   .typed<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, bool)>(),
               op("flash_eqlinear::eq_linear_fwd_split3")
                   .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                                     const OptTensor&)>(),
               op("flash_eqlinear::eq_linear_bwd_split3")
                   .typed<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, bool, bool, bool, bool)>(),
               op("flash_eqlinear::eq_linear_group")
                   .typed<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&,
                                                  const at::Tensor&, std::optional<at::ScalarType>,
                                                  std::optional<int64_t>, bool)>(),
               op("flash_eqlinear::group_planes")
                   .typed<at::Tensor(const at::Tensor&, const at::Tensor&, std::optional<at::ScalarType>)>()};
  }();
  return o;
}

// An int of a shape, specialized where it is symbolic (under tracing: the planes' sizes, x's last dimension).
int64_t concrete(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }

// Sizes as Python prints them (symbolic ones as "?").
std::string sym_shape(c10::SymIntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto v = sizes[i].maybe_as_int();
    s += (i ? ", " : "") + (v ? std::to_string(*v) : std::string("?"));
  }
  return s + (sizes.size() == 1 ? ",)" : ")");
}

// A dtype as Python prints it (the layer's messages read as flash_eqlinear.reference.check_inputs's).
std::string py_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// The layer's checks, with the exception types and messages of flash_eqlinear.reference.check_inputs
// (TypeError, ValueError, RuntimeError); returns (c, d). x_rounded: an FP32 x with fp16 / bf16 planes is
// rounded in the op (autocast's kernel asks for it).
std::pair<int64_t, int64_t> check_layer_args(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias,
                                             bool x_rounded) {
  TORCH_CHECK_TYPE(x.is_floating_point(), "input must be a floating-point tensor, got dtype ", py_dtype(x.scalar_type()));
  TORCH_CHECK_TYPE(planes.is_floating_point(), "weight must be a floating-point tensor, got dtype ",
                   py_dtype(planes.scalar_type()));
  TORCH_CHECK_VALUE(planes.dim() == 3, "weight must have shape (T, d, c), got ", sym_shape(planes.sym_sizes()));
  const int64_t T = concrete(planes.sym_size(0)), d = concrete(planes.sym_size(1)), c = concrete(planes.sym_size(2));
  TORCH_CHECK_VALUE(T == 4, "weight ", sym_shape(planes.sym_sizes()), " holds group size ", num(T),
                    " but group_size=4 (planes weights are (T, d, c); group-domain ones (d, c, T) convert by "
                    "flash_eqlinear.naive_to_planes)");
  TORCH_CHECK_VALUE(x.dim() >= 1 && concrete(x.sym_size(-1)) == 4 * c,
                    "input's last dimension must be in_features = c*T = ", num(c), "*4 = ", num(4 * c),
                    ", got input of shape ", sym_shape(x.sym_sizes()));
  const auto low = planes.scalar_type();
  const bool rounded = x_rounded && x.scalar_type() == at::kFloat && (low == at::kHalf || low == at::kBFloat16);
  TORCH_CHECK(x.scalar_type() == low || rounded, "input dtype ", py_dtype(x.scalar_type()),
              " does not match weight dtype ", py_dtype(low));
  TORCH_CHECK(x.device() == planes.device(), "input is on ", x.device().str(), " but weight is on ",
              planes.device().str());
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && concrete(bias->sym_size(0)) == d, "bias must have shape (d,) = (", num(d),
                      ",), got ", sym_shape(bias->sym_sizes()));
    TORCH_CHECK(bias->scalar_type() == low, "bias dtype ", py_dtype(bias->scalar_type()),
                " does not match weight dtype ", py_dtype(low));
    TORCH_CHECK(bias->device() == planes.device(), "bias is on ", bias->device().str(), " but weight is on ",
                planes.device().str());
  }
  TORCH_CHECK(x.is_cuda(), "flash_eqlinear::eq_linear runs on CUDA tensors, got input on ", x.device().str());
  TORCH_CHECK(kernel_dtype(low), "flash_eqlinear::eq_linear: dtype must be float32, float16 or bfloat16, got ",
              py_dtype(low));
  return {c, d};
}

// y (M, 4d) as (..., 4d) for x (..., 4c), not marked as a view (as aten::linear returns it): in-place ops on
// the output stay allowed.
at::Tensor shaped_like_input(const at::Tensor& y, const at::Tensor& x, int64_t d) {
  if (x.dim() == 2) return y;
  std::vector<c10::SymInt> sizes = x.sym_sizes().vec();
  sizes.back() = 4 * d;
  return at::_unsafe_view_symint(y, sizes);
}

// The adjoint (transpose) of x -> [f0 | f2 | fR | fI] / 2 (eq_linear_fwd_xf's planes of x): a gradient
// (M, 4c) with respect to the planes -> one (M, 4c) with respect to x, in FP32. Differentiable.
at::Tensor halved_planes_adjoint(const at::Tensor& g) {
  const std::vector<at::Tensor> b = g.to(at::kFloat).unflatten(1, {4, -1}).unbind(1);
  const at::Tensor s = (b[0] + b[1]) * 0.5, t = (b[0] - b[1]) * 0.5;
  return at::stack({s + b[2] * 0.5, t - b[3] * 0.5, s - b[2] * 0.5, t + b[3] * 0.5}, -1).flatten(1);
}

class EqLinearFunction : public torch::autograd::Function<EqLinearFunction> {
 public:
  // Outputs: y, and what the node keeps besides the planes when that is made here (x rounded, x's planes),
  // else an empty (0,) tensor. form: Form, from the plan.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& planes,
                               const OptTensor& bias, int64_t form) {
    const at::AutoDispatchBelowADInplaceOrView below;
    const int64_t d = concrete(planes.sym_size(1)), c = concrete(planes.sym_size(2));
    const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, 4 * c});
    at::Tensor y, kept;
    if (form == kRoundXForm) {
      std::tie(y, kept) = ops().cast.call(x2, planes, bias);
    } else if (form == kKeepPlanesForm) {  // (an FP32 x under autocast is rounded first)
      std::tie(y, kept) = ops().xf.call(x2.to(planes.scalar_type()), planes, bias);
    } else {
      y = ops().fwd.call(x2, planes, bias);
      kept = at::empty({0}, y.options());
    }
    ctx->saved_data["form"] = form;
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["x_sizes"] = x.sym_sizes();
    ctx->saved_data["c"] = c;
    ctx->saved_data["d"] = d;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->save_for_backward({form == kPlainForm ? x : kept, planes});
    ctx->set_materialize_grads(false);  // (kept's gradient: undefined unless a double backward reaches it)
    return {shaped_like_input(y, x, d), kept};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& t = saved[0];  // x, x rounded, or x's planes (Form)
    const at::Tensor& planes = saved[1];
    const int64_t form = ctx->saved_data["form"].toInt();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::vector<c10::SymInt> x_sizes = ctx->saved_data["x_sizes"].toSymIntVector();
    const auto x_dtype = ctx->saved_data["x_dtype"].toScalarType();
    const bool needs_x = ctx->needs_input_grad(0), needs_p = ctx->needs_input_grad(1);
    const bool needs_b = has_bias && ctx->needs_input_grad(2);
    const int64_t c = ctx->saved_data["c"].toInt(), d = ctx->saved_data["d"].toInt();
    at::Tensor gx, gp, gb;
    if (grads[0].defined()) {
      const at::Tensor gy = grads[0].reshape({-1, 4 * d});
      const at::Tensor t2 = t.dim() == 2 ? t : t.reshape({-1, 4 * c});
      if (at::GradMode::is_enabled()) {  // create_graph=True: gradients that are differentiable themselves
        std::tie(gx, gp, gb) = ops().differentiable.call(gy, t2, planes, form, needs_x, needs_p, needs_b);
      } else {
        const at::AutoDispatchBelowADInplaceOrView below;
        std::tie(gx, gp, gb) = form == kKeepPlanesForm
                                   ? ops().bwd_xf.call(gy, t2, planes, needs_x, needs_p, needs_b)
                                   : ops().bwd.call(gy, t2, planes, needs_x, needs_p, needs_b, form == kRoundXForm);
      }
    }
    if (needs_x && form != kPlainForm && grads[1].defined()) {  // a double backward reached the kept tensor
      const at::Tensor g = form == kRoundXForm ? grads[1].to(at::kFloat) : halved_planes_adjoint(grads[1]);
      gx = gx.defined() ? gx + g.to(gx.scalar_type()) : g;
    }
    if (needs_x && gx.defined()) gx = gx.view_symint(x_sizes).to(x_dtype);
    return {needs_x ? gx : at::Tensor(), needs_p ? gp : at::Tensor(), needs_b ? gb : at::Tensor(), at::Tensor()};
  }
};

// The training forward in three parts of their own (TrainForm::kParts, flash_eq_linear_chunks' q, k, v):
// eq_linear_fwd_split3 writes them in place, eq_linear_bwd_split3 reads their gradients where they are.
class EqLinearPartsFunction : public torch::autograd::Function<EqLinearPartsFunction> {
 public:
  // Outputs: the three parts (..., 4d / 3), and x rounded to the planes' dtype where x is FP32 (else empty).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& planes,
                               const OptTensor& bias) {
    const at::AutoDispatchBelowADInplaceOrView below;
    const int64_t d = concrete(planes.sym_size(1)), c = concrete(planes.sym_size(2));
    const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, 4 * c});
    auto [y0, y1, y2, x_low] = ops().split3.call(x2, planes, bias);
    const bool rounded = x.scalar_type() != planes.scalar_type();
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["rounded"] = rounded;
    ctx->saved_data["x_sizes"] = x.sym_sizes();
    ctx->saved_data["c"] = c;
    ctx->saved_data["d"] = d;
    ctx->save_for_backward({rounded ? x_low : x, planes});
    ctx->set_materialize_grads(false);
    return {shaped_like_input(y0, x, d / 3), shaped_like_input(y1, x, d / 3), shaped_like_input(y2, x, d / 3),
            x_low};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& t = saved[0];
    const at::Tensor& planes = saved[1];
    const bool rounded = ctx->saved_data["rounded"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::vector<c10::SymInt> x_sizes = ctx->saved_data["x_sizes"].toSymIntVector();
    const int64_t c = ctx->saved_data["c"].toInt(), d = ctx->saved_data["d"].toInt();
    const bool needs_x = ctx->needs_input_grad(0), needs_p = ctx->needs_input_grad(1);
    const bool needs_b = has_bias && ctx->needs_input_grad(2);
    at::Tensor gx, gp, gb;
    if (grads[0].defined() || grads[1].defined() || grads[2].defined()) {
      const at::Tensor t2 = t.dim() == 2 ? t : t.reshape({-1, 4 * c});
      std::vector<at::Tensor> parts;
      for (int i = 0; i < 3; ++i)
        parts.push_back(grads[i].defined() ? grads[i].reshape({-1, 4 * d / 3})
                                           : at::zeros({t2.size(0), 4 * d / 3}, planes.options()));
      if (at::GradMode::is_enabled()) {  // create_graph=True
        std::tie(gx, gp, gb) = ops().differentiable.call(at::cat(parts, 1), t2, planes, rounded ? kRoundXForm : kPlainForm,
                                                         needs_x, needs_p, needs_b);
      } else {
        const at::AutoDispatchBelowADInplaceOrView below;
        std::tie(gx, gp, gb) =
            ops().bwd_split3.call(parts[0], parts[1], parts[2], t2, planes, needs_x, needs_p, needs_b, rounded);
      }
    }
    if (needs_x && rounded && grads[3].defined()) {  // a double backward reached the rounded x
      const at::Tensor g = grads[3].to(at::kFloat);
      gx = gx.defined() ? gx + g : g;
    }
    if (needs_x && gx.defined()) gx = gx.view_symint(x_sizes);
    return {needs_x ? gx : at::Tensor(), needs_p ? gp : at::Tensor(), needs_b ? gb : at::Tensor()};
  }
};

// The plan's training form of a call with gradients recorded (needs_*), x checked (c, d).
TrainForm train_form(const at::Tensor& x, const at::Tensor& planes, int64_t c, int64_t d, bool needs_x,
                     bool needs_p, bool needs_b, int chunks) {
  LayerQuery q;
  const auto numel = x.sym_numel().maybe_as_int();  // (no decision depends on M: 0 where it is symbolic)
  q.M = numel ? *numel / (4 * c) : 0, q.c = c, q.d = d;
  q.elem = elem_of(planes.scalar_type());
  q.x_fp32 = x.scalar_type() != planes.scalar_type();
  q.sm_major = sm_major_of(x);
  q.tf32 = tf32_allowed();
  q.needs_x = needs_x, q.needs_p = needs_p, q.needs_b = needs_b;
  q.chunks = chunks;
  return plan_layer(q).train;
}

void check_chunks(int64_t chunks, int64_t d) {
  TORCH_CHECK_VALUE(chunks >= 1 && d % chunks == 0, "chunks must be a positive divisor of d = ", num(d),
                    " (whole fields each), got ", num(chunks));
}

}  // namespace

// The op's CUDA kernel: the forward without a node (no gradient recorded, or inference mode).
at::Tensor eq_linear_cuda(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias, bool x_rounded) {
  const auto [c, d] = check_layer_args(x, planes, bias, x_rounded);
  const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, 4 * c});
  const at::Tensor y = fwd(x2.to(planes.scalar_type()), planes, bias, false, "eq_linear");
  return shaped_like_input(y, x, d);
}

// The op's autograd kernel: where a gradient is recorded, the plan's training form as one node.
at::Tensor eq_linear_autograd(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias, bool x_rounded) {
  const bool grad = at::GradMode::is_enabled();
  const bool needs_x = grad && x.requires_grad(), needs_p = grad && planes.requires_grad();
  const bool needs_b = grad && bias.has_value() && bias->requires_grad();
  if (!needs_x && !needs_p && !needs_b) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return ops().layer.call(x, planes, bias, x_rounded);
  }
  const auto [c, d] = check_layer_args(x, planes, bias, x_rounded);
  const TrainForm train = train_form(x, planes, c, d, needs_x, needs_p, needs_b, 0);
  const int64_t form = train == TrainForm::kKeepPlanes ? kKeepPlanesForm
                       : train == TrainForm::kRoundX ? kRoundXForm
                                                     : kPlainForm;
  return EqLinearFunction::apply(x, planes, bias, form)[0];
}

// x as the autocast kernels pass it on, and whether it stayed FP32 for the op to round (plan_rounds_x).
std::pair<at::Tensor, bool> autocast_input(const at::Tensor& x, const at::Tensor& planes) {
  const at::ScalarType cast = at::autocast::get_autocast_dtype(at::kCUDA);
  const bool keep32 = (cast == at::kHalf || cast == at::kBFloat16) && x.scalar_type() == at::kFloat &&
                      at::GradMode::is_enabled() && x.requires_grad() && planes.is_floating_point() &&
                      planes.scalar_type() != at::kDouble && plan_rounds_x();
  return {keep32 ? x : at::autocast::cached_cast(cast, x, c10::DeviceType::CUDA), keep32};
}

// The op's autocast kernel: nn.Linear's casts (the cached casts of parameters within an autocast region, as
// autocast keeps them), except that an FP32 x whose gradient is recorded stays FP32 for the op to round
// (plan_rounds_x): same values, and grad_x comes back in FP32 without a cast's backward pass.
at::Tensor eq_linear_autocast(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias, bool x_rounded) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const auto [xc, keep32] = autocast_input(x, planes);
  const at::ScalarType cast = at::autocast::get_autocast_dtype(at::kCUDA);
  return ops().layer.call(xc, at::autocast::cached_cast(cast, planes, c10::DeviceType::CUDA),
                          at::autocast::cached_cast(cast, bias, c10::DeviceType::CUDA), x_rounded || keep32);
}

// The chunks op (flash_eq_linear_chunks): the layer's output as `chunks` column blocks of whole fields. Returns
// the three parts where the plan writes them in place (TrainForm::kParts), else the whole output [y], which
// the caller chunks into views.
std::vector<at::Tensor> eq_linear_chunks_cuda(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias,
                                              int64_t chunks, bool x_rounded) {
  check_chunks(chunks, concrete(planes.sym_size(1)));
  return {eq_linear_cuda(x, planes, bias, x_rounded)};
}

std::vector<at::Tensor> eq_linear_chunks_autograd(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias,
                                                  int64_t chunks, bool x_rounded) {
  const bool grad = at::GradMode::is_enabled();
  const bool needs_x = grad && x.requires_grad(), needs_p = grad && planes.requires_grad();
  const bool needs_b = grad && bias.has_value() && bias->requires_grad();
  if (!needs_x && !needs_p && !needs_b) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return ops().chunks.call(x, planes, bias, chunks, x_rounded);
  }
  const auto [c, d] = check_layer_args(x, planes, bias, x_rounded);
  check_chunks(chunks, d);
  if (chunks == 3 && train_form(x, planes, c, d, needs_x, needs_p, needs_b, 3) == TrainForm::kParts) {
    const variable_list out = EqLinearPartsFunction::apply(x, planes, bias);
    return {out[0], out[1], out[2]};
  }
  return {eq_linear_autograd(x, planes, bias, x_rounded)};
}

std::vector<at::Tensor> eq_linear_chunks_autocast(const at::Tensor& x, const at::Tensor& planes, const OptTensor& bias,
                                                  int64_t chunks, bool x_rounded) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const auto [xc, keep32] = autocast_input(x, planes);
  const at::ScalarType cast = at::autocast::get_autocast_dtype(at::kCUDA);
  return ops().chunks.call(xc, at::autocast::cached_cast(cast, planes, c10::DeviceType::CUDA),
                           at::autocast::cached_cast(cast, bias, c10::DeviceType::CUDA), chunks, x_rounded || keep32);
}

// The layer on a group-domain weight, composite: every step an op of its own (group_planes' node and the
// layer's, or their kernels below autograd; under tracing, their fakes). A naive bias of d elements in another
// shape ((d, 1)) is reshaped to (d,).
std::vector<at::Tensor> eq_linear_group(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                        const at::Tensor& basis, std::optional<at::ScalarType> dtype,
                                        std::optional<int64_t> chunks, bool x_rounded) {
  const at::Tensor planes = ops().planes.call(weight, basis, dtype);
  const OptTensor b = bias.has_value() && bias->dim() != 1 ? OptTensor(bias->reshape({-1})) : bias;
  if (!chunks.has_value()) return {ops().layer.call(x, planes, b, x_rounded)};
  return ops().chunks.call(x, planes, b, *chunks, x_rounded);
}

// Its autocast kernel: eq_linear's casts, with the planes made in autocast's dtype from the FP32 weight (one
// rounding, no cast of its own).
std::vector<at::Tensor> eq_linear_group_autocast(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                                 const at::Tensor& basis, std::optional<at::ScalarType> dtype,
                                                 std::optional<int64_t> chunks, bool x_rounded) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const auto [xc, keep32] = autocast_input(x, weight);
  const at::ScalarType cast = at::autocast::get_autocast_dtype(at::kCUDA);
  const bool eligible = weight.is_floating_point() && weight.scalar_type() != at::kDouble;  // (autocast's rule)
  return ops().group.call(xc, weight, at::autocast::cached_cast(cast, bias, c10::DeviceType::CUDA), basis,
                          eligible ? std::optional<at::ScalarType>(cast) : dtype, chunks, x_rounded || keep32);
}

std::string eq_linear_plan_op(int64_t M, int64_t c, int64_t d, at::ScalarType dtype, bool x_fp32, at::Device device,
                              bool needs_x, bool needs_p, bool needs_b, int64_t chunks) {
  TORCH_CHECK(device.is_cuda(), "eq_linear_plan: the fused kernels' plan is for CUDA devices, got ", device.str());
  TORCH_CHECK_VALUE(M >= 0 && c >= 1 && d >= 1, "eq_linear_plan: want M >= 0, c >= 1, d >= 1, got ", num(M), ", ",
                    num(c), ", ", num(d));
  TORCH_CHECK_TYPE(kernel_dtype(dtype), "eq_linear_plan: dtype must be float32, float16 or bfloat16, got ",
                   py_dtype(dtype));
  LayerQuery q;
  q.M = M, q.c = c, q.d = d;
  q.elem = elem_of(dtype);
  q.x_fp32 = x_fp32 && dtype != at::kFloat;
  q.sm_major = at::cuda::getDeviceProperties(device.has_index() ? device.index() : at::cuda::current_device())->major;
  q.tf32 = tf32_allowed();
  q.needs_x = needs_x, q.needs_p = needs_p, q.needs_b = needs_b;
  q.chunks = static_cast<int>(chunks);
  return explain_layer(q);
}

}  // namespace flash_eqlinear
