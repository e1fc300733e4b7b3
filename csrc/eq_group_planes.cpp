// flash_eqlinear::group_planes(weight, basis): the frequency planes (T, d, c) of a group-domain weight
// (d, c, T), planes[k] = sum_t basis[k, t] * weight[..., t], as one product, with its autograd formula here:
// the eager layer that keeps a naive layer's parameters (SwappedEQLinear) makes its planes per training call
// with one dispatcher call and one node, where stock ops under autocast take seven calls (casts both ways).
//
// The product runs in the basis's dtype (FP32 for 16-bit weights, rounded once to the weight's dtype) and
// outside autocast: autocast would round the basis and the weight to 16 bits before the product, which is
// not what the naive layer computes. Any device (CompositeExplicitAutograd); the backward is stock ops, so
// create_graph=True differentiates it again.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "eq_host_common.h"
#include "eq_ops.h"

namespace flash_eqlinear {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// (Messages from strings only: eq_host_common.h says why.)
void check_group_planes(const at::Tensor& w, const at::Tensor& basis) {
  TORCH_CHECK_VALUE(basis.dim() == 2 && basis.size(0) == basis.size(1) && basis.size(0) >= 1,
                    "group_planes: basis must be a square (T, T) matrix, got ", shape(basis.sizes()));
  TORCH_CHECK_VALUE(w.dim() == 3 && w.size(2) == basis.size(0), "group_planes: weight must have shape (d, c, T) = (d, c, ",
                    num(basis.size(0)), "), got ", shape(w.sizes()));
  TORCH_CHECK_TYPE(w.is_floating_point() && basis.is_floating_point(),
                   "group_planes: weight and basis must be floating point, got ",
                   std::string(c10::toString(w.scalar_type())), " and ", std::string(c10::toString(basis.scalar_type())));
  TORCH_CHECK(w.device() == basis.device(), "group_planes: weight is on ", w.device().str(), " but basis on ",
              basis.device().str());
}

// (T, T) @ (T, d*c), the weight read transposed in place: the planes contiguous.
at::Tensor planes_of(const at::Tensor& w, const at::Tensor& basis) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t T = basis.size(0);
  return at::mm(basis, w.reshape({-1, T}).to(basis.scalar_type()).t())
      .view({T, w.size(0), w.size(1)})
      .to(w.scalar_type());
}

class GroupPlanesFunction : public torch::autograd::Function<GroupPlanesFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, const at::Tensor& basis) {
    ctx->save_for_backward({basis});
    ctx->saved_data["dtype"] = static_cast<int64_t>(w.scalar_type());
    return planes_of(w, basis);
  }

  // The adjoint: grad_w (d*c, T) = grad_planes^T (d*c, T) @ basis, contiguous in the weight's layout.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor basis = ctx->get_saved_variables()[0];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor& g = grads[0];
    const int64_t T = basis.size(0);
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::Tensor gw = at::mm(g.reshape({T, -1}).to(basis.scalar_type()).t(), basis);
    return {gw.view({g.size(1), g.size(2), T}).to(dtype), at::Tensor()};
  }
};

}  // namespace

at::Tensor group_planes(const at::Tensor& w, const at::Tensor& basis) {
  check_group_planes(w, basis);
  return planes_of(w, basis);
}

at::Tensor group_planes_autograd(const at::Tensor& w, const at::Tensor& basis) {
  check_group_planes(w, basis);
  if (!(at::GradMode::is_enabled() && w.requires_grad())) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return planes_of(w, basis);
  }
  return GroupPlanesFunction::apply(w, basis);
}

}  // namespace flash_eqlinear
