// flash_eqlinear::group_planes(weight, basis, dtype): the frequency planes (T, d, c) of a group-domain weight
// (d, c, T) or (d, 1, c, T), planes[k] = sum_t basis[k, t] * weight[..., t], and group_planes_adjoint, its
// transpose (the weight's gradient from the planes'), with the autograd formula here: the eager layer that
// keeps a naive layer's parameters (SwappedEQLinear, through eq_linear_group) makes its planes per training
// call in one pass, already in the dtype the layer runs in (autocast's), where a product and two casts took
// three.
//
// FP32 arithmetic for FP32 and 16-bit weights (the basis's dtype in general), one rounding to `dtype`, and no
// autocast: autocast would round the basis and the weight to 16 bits before the product, which is not what
// the naive layer computes. On CUDA one kernel (eq_group_planes.cu) for FP32 / fp16 / bf16 with an FP32 basis
// and T <= 16; elsewhere and otherwise stock ops (CompositeExplicitAutograd, also the fakes). Under
// create_graph=True the backward is stock ops, so the gradient is differentiable again.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "eq_group_planes.h"
#include "eq_host_common.h"
#include "eq_ops.h"

namespace flash_eqlinear {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptDtype = std::optional<at::ScalarType>;

// (Messages from strings only: eq_host_common.h says why.)
std::string dtype_name(at::ScalarType t) { return std::string(c10::toString(t)); }

void check_dtype(const char* op, at::ScalarType dtype) {
  TORCH_CHECK_TYPE(at::isFloatingType(dtype), op, ": dtype must be a floating-point type, got ", dtype_name(dtype));
}

struct PlanesArgs {
  int64_t d, c, T;
  at::ScalarType out;  // the planes' dtype
};

// group_planes' arguments checked: the weight's (d, c, T) against the basis, and the planes' dtype.
PlanesArgs check_group_planes(const at::Tensor& w, const at::Tensor& basis, OptDtype dtype) {
  TORCH_CHECK_VALUE(basis.dim() == 2 && basis.size(0) == basis.size(1) && basis.size(0) >= 1,
                    "group_planes: basis must be a square (T, T) matrix, got ", shape(basis.sizes()));
  const int64_t T = basis.size(0);
  TORCH_CHECK_VALUE((w.dim() == 3 || (w.dim() == 4 && w.size(1) == 1)) && w.size(-1) == T,
                    "group_planes: weight must have shape (d, c, T) or (d, 1, c, T) with T = ", num(T), ", got ",
                    shape(w.sizes()));
  TORCH_CHECK_TYPE(w.is_floating_point() && basis.is_floating_point(),
                   "group_planes: weight and basis must be floating point, got ", dtype_name(w.scalar_type()),
                   " and ", dtype_name(basis.scalar_type()));
  TORCH_CHECK(w.device() == basis.device(), "group_planes: weight is on ", w.device().str(), " but basis on ",
              basis.device().str());
  const at::ScalarType out = dtype.value_or(w.scalar_type());
  check_dtype("group_planes", out);
  return {w.size(0), w.size(-2), T, out};
}

// Whether the kernel takes this call (else stock ops).
bool kernel_takes(const at::Tensor& t, at::ScalarType out, const at::Tensor& basis) {
  return t.is_cuda() && kernel_dtype(t.scalar_type()) && kernel_dtype(out) && basis.scalar_type() == at::kFloat &&
         basis.size(0) <= kGroupPlanesMaxT;
}

// One launch: src (n, T) -> dst (T, n), or the adjoint (T, n) -> (n, T).
void launch(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& basis, bool adjoint, const char* op) {
  const c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor b = basis.contiguous();
  GroupPlanesParams p;
  p.src = src.data_ptr();
  p.dst = dst.data_ptr();
  p.basis = b.data_ptr<float>();
  p.T = static_cast<int>(basis.size(0));
  p.n = src.numel() / p.T;
  p.adjoint = adjoint;
  p.src_elem = elem_of(src.scalar_type());
  p.dst_elem = elem_of(dst.scalar_type());
  const cudaError_t err = eq_group_planes(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

// Stock ops, differentiable: (T, T) @ (T, d*c) in the basis's dtype, the weight read transposed in place.
at::Tensor planes_stock(const at::Tensor& w, const at::Tensor& basis, at::ScalarType dtype) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t T = basis.size(0);
  return at::mm(basis, w.reshape({-1, T}).to(basis.scalar_type()).t()).view({T, w.size(0), w.size(-2)}).to(dtype);
}

// The adjoint, stock ops: grad_w (d*c, T) = grad_planes^T (d*c, T) @ basis, as (d, c, T).
at::Tensor adjoint_stock(const at::Tensor& g, const at::Tensor& basis, at::ScalarType dtype) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t T = basis.size(0);
  return at::mm(g.reshape({T, -1}).to(basis.scalar_type()).t(), basis).view({g.size(1), g.size(2), T}).to(dtype);
}

void check_adjoint(const at::Tensor& g, const at::Tensor& basis, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(basis.dim() == 2 && basis.size(0) == basis.size(1) && g.dim() == 3 && g.size(0) == basis.size(0),
                    "group_planes_adjoint: want grad_planes (T, d, c) and basis (T, T), got ", shape(g.sizes()),
                    " and ", shape(basis.sizes()));
  TORCH_CHECK(g.device() == basis.device(), "group_planes_adjoint: grad_planes is on ", g.device().str(),
              " but basis on ", basis.device().str());
  check_dtype("group_planes_adjoint", dtype);
}

struct PlanesOps {
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, OptDtype)> planes;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType)> adjoint;
};

const PlanesOps& planes_ops() {
  static const PlanesOps o = [] {
    auto& d = c10::Dispatcher::singleton();
    return PlanesOps{
        d.findSchemaOrThrow("flash_eqlinear::group_planes", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, OptDtype)>(),
        d.findSchemaOrThrow("flash_eqlinear::group_planes_adjoint", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType)>()};
  }();
  return o;
}

class GroupPlanesFunction : public torch::autograd::Function<GroupPlanesFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, const at::Tensor& basis, OptDtype dtype) {
    ctx->save_for_backward({basis});
    ctx->saved_data["dtype"] = w.scalar_type();
    ctx->saved_data["sizes"] = w.sizes();
    const at::AutoDispatchBelowADInplaceOrView below;
    return planes_ops().planes.call(w, basis, dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor basis = ctx->get_saved_variables()[0];
    const auto dtype = ctx->saved_data["dtype"].toScalarType();
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor gw;
    if (at::GradMode::is_enabled()) {  // create_graph=True: differentiable
      gw = adjoint_stock(g, basis, dtype);
    } else {
      const at::AutoDispatchBelowADInplaceOrView below;
      gw = planes_ops().adjoint.call(g, basis, dtype);
    }
    return {gw.view(sizes), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor group_planes(const at::Tensor& w, const at::Tensor& basis, OptDtype dtype) {
  return planes_stock(w, basis, check_group_planes(w, basis, dtype).out);
}

at::Tensor group_planes_cuda(const at::Tensor& w, const at::Tensor& basis, OptDtype dtype) {
  const auto [d, c, T, out] = check_group_planes(w, basis, dtype);
  if (!kernel_takes(w, out, basis)) return planes_stock(w, basis, out);
  at::Tensor planes = at::empty({T, d, c}, w.options().dtype(out));
  launch(w.contiguous(), planes, basis, false, "group_planes");
  return planes;
}

at::Tensor group_planes_autograd(const at::Tensor& w, const at::Tensor& basis, OptDtype dtype) {
  check_group_planes(w, basis, dtype);
  if (!(at::GradMode::is_enabled() && w.requires_grad())) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return planes_ops().planes.call(w, basis, dtype);
  }
  return GroupPlanesFunction::apply(w, basis, dtype);
}

at::Tensor group_planes_adjoint(const at::Tensor& g, const at::Tensor& basis, at::ScalarType dtype) {
  check_adjoint(g, basis, dtype);
  return adjoint_stock(g, basis, dtype);
}

at::Tensor group_planes_adjoint_cuda(const at::Tensor& g, const at::Tensor& basis, at::ScalarType dtype) {
  check_adjoint(g, basis, dtype);
  if (!kernel_takes(g, dtype, basis)) return adjoint_stock(g, basis, dtype);
  at::Tensor gw = at::empty({g.size(1), g.size(2), g.size(0)}, g.options().dtype(dtype));
  launch(g.contiguous(), gw, basis, true, "group_planes_adjoint");
  return gw;
}

}  // namespace flash_eqlinear
