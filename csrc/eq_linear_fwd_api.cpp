// The forward ops (registered in eq_ops.cpp): argument checks, and the forward that follows the plan
// (eq_linear_plan.h) for one 2-D call. The layer op eq_linear (eq_linear_autograd.cpp) calls these.
#include <tuple>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "eq_host_common.h"
#include "eq_linear_fwd.h"
#include "eq_linear_fwd_narrow.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_linear_host.h"
#include "eq_ops.h"

namespace flash_eqlinear {

// The forward ops' argument checks (`what` names the op); returns the bias made contiguous, or an
// undefined tensor for None.
at::Tensor checked_fwd_args(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias,
                            const char* what) {
  const std::string op = what;
  TORCH_CHECK(x.is_cuda() && planes.is_cuda(), op, ": x and planes must be CUDA tensors, got ", x.device().str(),
              " and ", planes.device().str());
  TORCH_CHECK(x.device() == planes.device(), op, ": x is on ", x.device().str(), " but planes on ",
              planes.device().str());
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D (M, 4c), got ", shape(x.sizes()));
  TORCH_CHECK(planes.dim() == 3 && planes.size(0) == 4, op, ": planes must have shape (4, d, c), got ",
              shape(planes.sizes()));
  const int64_t d = planes.size(1), c = planes.size(2);
  TORCH_CHECK(c >= 1 && d >= 1, op, ": c and d must be >= 1, got planes ", shape(planes.sizes()));
  TORCH_CHECK(x.size(1) == 4 * c, op, ": x has ", num(x.size(1)), " features but planes ", shape(planes.sizes()),
              " expect 4*c = ", num(4 * c));
  const auto dtype = x.scalar_type();
  TORCH_CHECK(kernel_dtype(dtype), op, ": dtype must be float32, float16 or bfloat16, got ", c10::toString(dtype));
  TORCH_CHECK(planes.scalar_type() == dtype, op, ": planes dtype ", c10::toString(planes.scalar_type()),
              " does not match x dtype ", c10::toString(dtype));
  at::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.device() == x.device(), op, ": bias is on ", b.device().str(), " but x on ", x.device().str());
    TORCH_CHECK(b.dim() == 1 && b.size(0) == d, op, ": bias must have shape (", num(d), ",), got ",
                shape(b.sizes()));
    TORCH_CHECK(b.scalar_type() == dtype, op, ": bias dtype ", c10::toString(b.scalar_type()),
                " does not match x dtype ", c10::toString(dtype));
  }
  check_device_supported(x);
  return b;
}

FwdChoice forward_choice(const at::Tensor& x, int64_t M, int64_t c, int64_t d, const void* y) {
  const FwdParams p{x.data_ptr(), nullptr, nullptr, const_cast<void*>(y), M, c, d};
  return plan_forward(p, elem_of(x.scalar_type()), sm_major_of(x), tf32_allowed());
}

// The forward ops' shared body: x (M, 4c), planes (4, d, c), bias (d,) or None -> y (M, 4d); all one
// dtype, on one CUDA device (`what` names the op), by the plan's kernel (forward_choice). With gelu,
// y = GELU(the layer's output) (exact erf form, of the output rounded to its dtype): the kernels with a
// GELU epilogue (the fp16 / bf16 Hopper and mma.sync kernels, the TF32 Hopper kernel; FwdParams::gelu)
// apply it as they store, the other forms (narrow kernel, exact FP32, 3xTF32, the GEMM forms) by
// at::gelu_ after. With f32_out (fp16 / bf16 tensors, not with gelu), y is FP32: the fp16 / bf16 Hopper
// and mma.sync kernels store it unrounded (FwdParams::y_f32), the narrow kernel and the GEMM forms write
// it in x's dtype, widened after.
at::Tensor fwd(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias, bool gelu,
               const char* what, bool f32_out) {
  const at::Tensor b = checked_fwd_args(x, planes, bias, what);
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2);
  const auto dtype = x.scalar_type();
  const at::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), pc = planes.contiguous();
  const bool f32 = f32_out && dtype != at::kFloat;
  TORCH_CHECK(!(f32 && gelu), what, ": an FP32 output of 16-bit inputs is not combined with GELU");
  at::Tensor y = at::empty({M, 4 * d}, x.options().dtype(f32 ? at::kFloat : dtype));
  if (M == 0) return y;
  // What the forms without an FP32 epilogue write: y itself, or with f32 a 16-bit buffer made when needed.
  at::Tensor ylow = f32 ? at::Tensor() : y;
  const auto low = [&]() -> at::Tensor& {
    if (!ylow.defined()) ylow = at::empty({M, 4 * d}, x.options());
    return ylow;
  };
  FwdParams p{xc.data_ptr(), pc.data_ptr(), b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), M, c, d};
  FwdParams pg = p;  // for the kernels with a GELU or FP32 epilogue
  pg.gelu = gelu;
  pg.y_f32 = f32;
  // y as computed; where the kernel that wrote it had no epilogue for it, GELU after it, and the widening
  const auto done = [&](bool in_epilogue) {
    if (in_epilogue) return y;
    if (gelu) at::gelu_(ylow);
    return f32 ? y.copy_(ylow) : y;
  };
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto checked = [&](cudaError_t err, const char* kernel) {
    TORCH_CHECK(err == cudaSuccess, what, ": ", kernel, " launch failed (M=", num(M), ", c=", num(c), ", d=",
                num(d), ", ", c10::toString(dtype), "): ", cudaGetErrorString(err));
  };
  const FwdChoice choice = forward_choice(xc, M, c, d, f32 ? nullptr : y.data_ptr());
  bool launched = false;
  switch (choice.path) {
    case FwdPath::kNarrow:  // one streaming pass, no epilogue options
      p.y = low().data_ptr();
      checked(eq_linear_fwd_narrow(p, static_cast<int>(x.element_size()), dtype == at::kBFloat16, stream),
              "narrow kernel");
      return done(false);
    case FwdPath::kSplitTf32:
      eq_linear_fwd_3xtf32(xc, pc, b, y);
      return done(false);
    case FwdPath::kTf32Hopper:
      checked(eq_linear_fwd_sm90_tf32(pg, stream, &launched), "TF32 Hopper kernel");
      if (launched) return done(true);
      [[fallthrough]];  // choice.fallback: the GEMM form
    case FwdPath::kTf32Gemm:
      fwd_gemm_form_chunked(xc, pc, b, y, "eq_linear_fwd (tf32)", plan_three_products(c * d, Elem::kFloat));
      return done(false);
    case FwdPath::kExactFp32:
      checked(eq_linear_fwd_fp32(p, stream), "exact FP32 kernel");
      return done(false);
    case FwdPath::kHopper16:
      if (fwd_sm90_16bit(xc, pc, b, y, at::Tensor(), 1.f, at::Tensor(), gelu)) return done(true);
      break;  // choice.fallback
    case FwdPath::kGemm16:
    case FwdPath::kMma16:
      break;
  }
  const FwdPath path = choice.path == FwdPath::kHopper16 ? choice.fallback : choice.path;
  if (path == FwdPath::kGemm16) {
    fwd_gemm_form_chunked(xc, pc, b, low(), "eq_linear_fwd", plan_three_products(c * d, elem_of(dtype)));
    return done(false);
  }
  TORCH_INTERNAL_ASSERT(path == FwdPath::kMma16, what, ": no kernel for path ", name(path));
  checked(dtype == at::kHalf ? eq_linear_fwd_fp16(pg, stream) : eq_linear_fwd_bf16(pg, stream), "mma.sync kernel");
  return done(true);
}

// x (M, 4c), planes (4, d, c), bias (d,) or None -> y (M, 4d); all one dtype, on one CUDA device.
at::Tensor eq_linear_fwd(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias) {
  return fwd(x, planes, bias, false, "eq_linear_fwd");
}

// GELU(eq_linear_fwd(x, planes, bias)): an MLP's first layer in inference, GELU in the kernel's epilogue
// where it has one (fwd).
at::Tensor eq_linear_fwd_gelu(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias) {
  return fwd(x, planes, bias, true, "eq_linear_fwd_gelu");
}

// An FP32 x with fp16 / bf16 planes and bias (autocast's input to a layer after an FP32 op such as
// LayerNorm): y = eq_linear_fwd(x rounded to the planes' dtype, planes, bias), and that rounded x (the
// backward's operand). Its backward (eq_linear_bwd with grad_x_fp32) writes grad_x in FP32 straight from
// the kernel, instead of a 16-bit grad_x widened by the backward of a separate cast.
std::tuple<at::Tensor, at::Tensor> eq_linear_fwd_cast(const at::Tensor& x, const at::Tensor& planes,
                                                      const std::optional<at::Tensor>& bias) {
  const auto low = planes.scalar_type();
  TORCH_CHECK(x.is_cuda(), "eq_linear_fwd_cast: x must be a CUDA tensor, got one on ", x.device().str());
  TORCH_CHECK(x.scalar_type() == at::kFloat && (low == at::kHalf || low == at::kBFloat16),
              "eq_linear_fwd_cast: want a float32 x and float16 / bfloat16 planes, got ",
              c10::toString(x.scalar_type()), " and ", c10::toString(low));
  const at::cuda::CUDAGuard guard(x.device());  // (fwd checks the shapes, with this op's name)
  const at::Tensor xl = x.to(x.options().dtype(low), false, false, at::MemoryFormat::Contiguous);
  return {fwd(xl, planes, bias, false, "eq_linear_fwd_cast"), xl};
}

// The training forward that keeps x's planes (the plan's TrainForm::kKeepPlanes): y as eq_linear_fwd
// computes it, and x's Fourier planes xf (M, 4c) = [f0 | f2 | fR | fI] / 2 (column blocks, eq_group_dft.h)
// for the backward to keep instead of x (same size): eq_linear_bwd_xf then needs no group DFT of x. fp16 /
// bf16 where the Hopper kernel takes the products: that kernel, writing the planes as a by-product; else
// the GEMM form, which makes them anyway.
std::tuple<at::Tensor, at::Tensor> eq_linear_fwd_xf(const at::Tensor& x, const at::Tensor& planes,
                                                    const std::optional<at::Tensor>& bias) {
  const at::Tensor b = checked_fwd_args(x, planes, bias, "eq_linear_fwd_xf");
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2);
  const at::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({M, 4 * d}, x.options());
  if (M == 0) return {y, at::empty_like(x, at::MemoryFormat::Contiguous)};
  const at::Tensor xc = x.contiguous(), pc = planes.contiguous();
  if (x.scalar_type() != at::kFloat && hopper_takes_products(c * d, sm_major_of(x))) {
    at::Tensor xf = at::empty({M, 4 * c}, x.options());
    if (fwd_sm90_16bit(xc, pc, b, y, xf, 0.5f)) return {y, xf};
  }
  const at::Tensor xf = fwd_gemm_form(xc, pc, b, y, "eq_linear_fwd_xf");
  return {y, xf};
}

// eq_linear_fwd with its output y (M, 4d) as its three column blocks y0, y1, y2 (M, 4d / 3) in tensors of
// their own (d % 3 == 0), written in place by the Hopper kernel where it runs (else y is made, then copied):
// consumers that take the parts, e.g. SDPA's q, k, v, then give their gradients back as three dense tensors,
// which eq_linear_bwd_split3 reads where they are. x as eq_linear_fwd takes it, or FP32 with fp16 / bf16
// planes, rounded first as eq_linear_fwd_cast does; x_low: that rounded x (what the backward takes), else an
// empty (0,) tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eq_linear_fwd_split3(const at::Tensor& x,
                                                                              const at::Tensor& planes,
                                                                              const std::optional<at::Tensor>& bias) {
  const char* what = "eq_linear_fwd_split3";
  TORCH_CHECK(x.is_cuda(), what, ": x must be a CUDA tensor, got one on ", x.device().str());
  const auto low = planes.scalar_type();
  const bool cast = x.scalar_type() == at::kFloat && (low == at::kHalf || low == at::kBFloat16);
  const at::cuda::CUDAGuard guard(x.device());
  const at::Tensor xl = cast ? x.to(x.options().dtype(low), false, false, at::MemoryFormat::Contiguous) : x;
  const at::Tensor b = checked_fwd_args(xl, planes, bias, what);
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2);
  TORCH_CHECK(d % 3 == 0, what, ": d = ", num(d), " output channels per group copy do not split into three parts");
  const int64_t w = 4 * d / 3;
  const at::Tensor y0 = at::empty({M, w}, xl.options()), y1 = at::empty({M, w}, xl.options()),
                   y2 = at::empty({M, w}, xl.options());
  const at::Tensor x_low = cast ? xl : at::empty({0}, xl.options());
  const std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> out{y0, y1, y2, x_low};
  if (M == 0) return out;
  const at::Tensor xc = xl.contiguous(), pc = planes.contiguous();
  at::Tensor y = y0;
  if (forward_choice(xc, M, c, d).path == FwdPath::kHopper16 &&
      fwd_sm90_16bit(xc, pc, b, y, at::Tensor(), 1.f, at::Tensor(), false, {}, {y1, y2}))
    return out;
  const at::Tensor full = fwd(xc, pc, b, false, what);
  y0.copy_(full.narrow(1, 0, w));
  y1.copy_(full.narrow(1, w, w));
  y2.copy_(full.narrow(1, 2 * w, w));
  return out;
}

}  // namespace flash_eqlinear
