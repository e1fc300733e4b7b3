// The op registrations: every op's schema, and its CUDA, autograd and autocast kernels where C++ has them
// (the other autograd formulas and the fakes are Python's: flash_eqlinear/_registry.py).
#include <Python.h>

#include <vector>

#include <torch/library.h>

#include "eq_ops.h"

namespace flash_eqlinear {

// Every op takes its tensors in any layout (it makes them contiguous and, where a kernel needs it, aligned,
// itself), so they are tagged flexible_layout: Inductor then hands over views of its buffers as they are.
// With its default for custom ops (the eager strides, exactly), a view of a not yet computed pointwise
// result was computed straight into a buffer of the view's shape, with indexing that Triton did not
// vectorize (docs/performance.md).
const std::vector<at::Tag> kAnyLayout = {at::Tag::flexible_layout};

TORCH_LIBRARY(flash_eqlinear, m) {
  // The layer (eq_linear_autograd.cpp): x (..., 4c), its autograd and autocast registered below.
  m.def("eq_linear(Tensor x, Tensor planes, Tensor? bias, bool x_rounded=False) -> Tensor", kAnyLayout);
  // Its output in column blocks (flash_eq_linear_chunks): the three parts of their own, or [whole output].
  m.def("eq_linear_chunks(Tensor x, Tensor planes, Tensor? bias, int chunks, bool x_rounded=False) -> Tensor[]",
        kAnyLayout);
  // Its differentiable gradients (create_graph=True): implemented in Python (flash_eqlinear/_registry.py).
  m.def("eq_linear_grads_differentiable(Tensor grad_y, Tensor saved, Tensor planes, int form, bool needs_x, "
        "bool needs_p, bool needs_b) -> (Tensor, Tensor, Tensor)");
  // The layer on a group-domain weight (SwappedEQLinear's eager call, eq_linear_autograd.cpp): its planes by
  // group_planes, then eq_linear ([y]) or, with chunks, eq_linear_chunks. Composite, with an autocast kernel.
  m.def("eq_linear_group(Tensor x, Tensor weight, Tensor? bias, Tensor basis, ScalarType? dtype=None, "
        "int? chunks=None, bool x_rounded=False) -> Tensor[]");
  // The planes (T, d, c) of a group-domain weight (d, c, T) or (d, 1, c, T) by a (T, T) basis, in `dtype`,
  // outside autocast, and the adjoint (planes' gradient -> (d, c, T)), with the autograd of the first
  // (eq_group_planes_api.cpp): SwappedEQLinear's eager transform, on any device.
  m.def("group_planes(Tensor weight, Tensor basis, ScalarType? dtype=None) -> Tensor");
  m.def("group_planes_adjoint(Tensor grad_planes, Tensor basis, ScalarType dtype) -> Tensor");
  // The plan of a call (eq_linear_plan.h), as text (flash_eqlinear.explain).
  m.def("eq_linear_plan(int M, int c, int d, ScalarType dtype, bool x_fp32, Device device, bool needs_x, "
        "bool needs_p, bool needs_b, int chunks) -> str",
        &eq_linear_plan_op);
  // The 2-D kernels' ops (eq_linear_fwd_api.cpp, eq_linear_bwd_api.cpp) and the group LayerNorm's.
  m.def("eq_linear_fwd(Tensor x, Tensor planes, Tensor? bias) -> Tensor", kAnyLayout);
  m.def("eq_linear_bwd_weight(Tensor x, Tensor grad_y) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_group_dft(Tensor t, bool input, bool sum) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_linear_bwd(Tensor grad_y, Tensor x, Tensor planes, bool needs_x, bool needs_p, bool needs_b, "
        "bool grad_x_fp32=False) -> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("eq_linear_fwd_xf(Tensor x, Tensor planes, Tensor? bias) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_linear_bwd_xf(Tensor grad_y, Tensor xf, Tensor planes, bool needs_x, bool needs_p, bool needs_b) "
        "-> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("eq_linear_fwd_gelu(Tensor x, Tensor planes, Tensor? bias) -> Tensor", kAnyLayout);
  // The layer for group sizes 2 and 8 (eq_linear_t_api.cpp): x (M, T c), planes (T, d, c); the forward's
  // autograd formula is Python's (flash_eqlinear/_registry.py).
  m.def("eq_linear_fwd_t(Tensor x, Tensor planes, Tensor? bias) -> Tensor", kAnyLayout);
  m.def("eq_linear_bwd_t(Tensor grad_y, Tensor x, Tensor planes, bool needs_x, bool needs_p, bool needs_b) "
        "-> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("eq_linear_fwd_cast(Tensor x, Tensor planes, Tensor? bias) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_linear_fwd_split3(Tensor x, Tensor planes, Tensor? bias) -> (Tensor, Tensor, Tensor, Tensor)", kAnyLayout);
  m.def("eq_linear_bwd_split3(Tensor gy0, Tensor gy1, Tensor gy2, Tensor x, Tensor planes, bool needs_x, "
        "bool needs_p, bool needs_b, bool grad_x_fp32=False) -> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("group_layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps, ScalarType out_dtype) "
        "-> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("group_layer_norm_bwd(Tensor grad_y, Tensor x, Tensor weight, Tensor mean, Tensor rstd, bool needs_x, "
        "bool needs_wb) -> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  // The norm's differentiable gradients (create_graph=True): implemented in Python (flash_eqlinear/layer_norm.py).
  m.def("group_layer_norm_grads_differentiable(Tensor grad_y, Tensor x, Tensor weight, float eps, bool needs_x, "
        "bool needs_wb) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flash_eqlinear, CUDA, m) {
  m.impl("eq_linear", &eq_linear_cuda);
  m.impl("eq_linear_chunks", &eq_linear_chunks_cuda);
  m.impl("eq_linear_fwd", &eq_linear_fwd);
  m.impl("eq_linear_bwd_weight", &eq_linear_bwd_weight);
  m.impl("eq_group_dft", &eq_group_dft_op);
  m.impl("eq_linear_bwd", &eq_linear_bwd);
  m.impl("eq_linear_fwd_xf", &eq_linear_fwd_xf);
  m.impl("eq_linear_bwd_xf", &eq_linear_bwd_xf);
  m.impl("eq_linear_fwd_gelu", &eq_linear_fwd_gelu);
  m.impl("eq_linear_fwd_t", &eq_linear_fwd_t);
  m.impl("eq_linear_bwd_t", &eq_linear_bwd_t);
  m.impl("eq_linear_fwd_cast", &eq_linear_fwd_cast);
  m.impl("eq_linear_fwd_split3", &eq_linear_fwd_split3);
  m.impl("eq_linear_bwd_split3", &eq_linear_bwd_split3);
  m.impl("group_layer_norm_fwd", &group_layer_norm_fwd);
  m.impl("group_layer_norm_bwd", &group_layer_norm_bwd);
  m.impl("group_planes", &group_planes_cuda);
  m.impl("group_planes_adjoint", &group_planes_adjoint_cuda);
}

TORCH_LIBRARY_IMPL(flash_eqlinear, Autograd, m) {
  m.impl("eq_linear", &eq_linear_autograd);
  m.impl("eq_linear_chunks", &eq_linear_chunks_autograd);
  m.impl("group_layer_norm_fwd", &group_layer_norm_fwd_autograd);
  m.impl("group_planes", &group_planes_autograd);
}

TORCH_LIBRARY_IMPL(flash_eqlinear, CompositeExplicitAutograd, m) {
  m.impl("group_planes", &group_planes);
  m.impl("group_planes_adjoint", &group_planes_adjoint);
}

TORCH_LIBRARY_IMPL(flash_eqlinear, CompositeImplicitAutograd, m) { m.impl("eq_linear_group", &eq_linear_group); }

TORCH_LIBRARY_IMPL(flash_eqlinear, AutocastCUDA, m) {
  m.impl("eq_linear", &eq_linear_autocast);
  m.impl("eq_linear_chunks", &eq_linear_chunks_autocast);
  m.impl("eq_linear_group", &eq_linear_group_autocast);
}

}  // namespace flash_eqlinear

// Importing flash_eqlinear._C runs the static registrations above; the module itself is empty.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
