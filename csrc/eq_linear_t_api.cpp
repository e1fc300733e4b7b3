// flash_eqlinear::eq_linear_fwd_t(x, planes, bias) and eq_linear_bwd_t: the layer for the group sizes 2 and 8
// (C2, C8) on CUDA, in the GEMM form: x's real DFT along the group axis (one pass, eq_group_dft_t.cu), the
// products per frequency as cuBLAS GEMMs with FP32 results, the synthesis with the bias (one pass, one
// rounding). For T = 8 that is 14/64 of the dense layer's multiply-adds (T = 2: 2/4). The backward: grad_x is
// the forward with the adjoint planes; the planes' gradient the per-frequency products of grad_y's and x's
// transforms over the rows; the bias's the column sums of grad_y. Where they run: ops.gemm_form_t.
//
// Orthonormal planes (fourier.py) P_j of the weight, x's orthonormal coordinates xf_j: the products are
// yf_j = sqrt(T) xf_j P_j^T for the real frequencies (k = 0, T/2) and, per cos / sin pair (r, i),
// [yf_r | yf_i] = sqrt(T / 2) [xf_r | xf_i] [[P_r, P_i], [-P_i, P_r]]^T (flash_eqlinear.reference._mix). The
// analysis writes f_j = sqrt(T) xf_j / T (reals) or sqrt(T / 2) xf_j / T (pairs), the unnormalised DFT over
// T: |f_j| <= max |x| (16-bit x stays in range), and the weights are the planes times T (exact: a power of
// two), so each 16-bit operand is rounded once, as x and the planes themselves are.
#include <cmath>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "eq_group_dft_t.h"
#include "eq_host_common.h"
#include "eq_linear_host.h"
#include "eq_ops.h"

namespace flash_eqlinear {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Whether plane j of T is a real frequency (k = 0, and k = T/2 for even T), else one of a cos / sin pair.
bool real_plane(int j, int T) { return j == 0 || (T % 2 == 0 && j == T - 1); }

// The orthonormal real DFT basis Q (T, T) in plane order (fourier.dft_basis), in double.
std::vector<double> dft_basis(int T) {
  std::vector<double> q(size_t(T) * T);
  for (int j = 0; j < T; ++j) {
    const int k = (j + 1) / 2;
    const bool is_sin = j % 2 == 0 && j > 0;
    const double scale = real_plane(j, T) ? 1.0 / std::sqrt(double(T)) : std::sqrt(2.0 / T);
    for (int s = 0; s < T; ++s) {
      const double angle = 2.0 * kPi / T * k * s;
      q[size_t(j) * T + s] = scale * (is_sin ? std::sin(angle) : std::cos(angle));
    }
  }
  return q;
}

// The checks of x (M, T c), planes (T, d, c) and bias (d,) (undefined: none); `op` names the op.
void check_fwd_t_args(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& b, const char* op) {
  TORCH_CHECK(x.is_cuda() && planes.is_cuda(), op, ": x and planes must be CUDA tensors, got ", x.device().str(),
              " and ", planes.device().str());
  TORCH_CHECK(x.device() == planes.device(), op, ": x is on ", x.device().str(), " but planes on ",
              planes.device().str());
  TORCH_CHECK_VALUE(planes.dim() == 3 && group_dft_t_supported(static_cast<int>(planes.size(0))), op,
                    ": planes must have shape (T, d, c) with group size T = 2 or 8, got ", shape(planes.sizes()));
  const int64_t T = planes.size(0), d = planes.size(1), c = planes.size(2);
  TORCH_CHECK_VALUE(c >= 1 && d >= 1, op, ": c and d must be >= 1, got planes ", shape(planes.sizes()));
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == T * c, op, ": x must be 2-D (M, T*c) = (M, ", num(T * c),
                    "), got ", shape(x.sizes()));
  const auto dtype = x.scalar_type();
  TORCH_CHECK_TYPE(kernel_dtype(dtype), op, ": dtype must be float32, float16 or bfloat16, got ", c10::toString(dtype));
  TORCH_CHECK(planes.scalar_type() == dtype, op, ": planes dtype ", c10::toString(planes.scalar_type()),
              " does not match x dtype ", c10::toString(dtype));
  if (b.defined()) {
    TORCH_CHECK(b.device() == x.device(), op, ": bias is on ", b.device().str(), " but x on ", x.device().str());
    TORCH_CHECK_VALUE(b.dim() == 1 && b.size(0) == d, op, ": bias must have shape (", num(d), ",), got ",
                      shape(b.sizes()));
    TORCH_CHECK(b.scalar_type() == dtype, op, ": bias dtype ", c10::toString(b.scalar_type()),
                " does not match x dtype ", c10::toString(dtype));
  }
  check_device_supported(x);
}

// The unnormalised DFT over T of t (M, T n) contiguous, column blocks in plane order: (M, T n) in t's dtype,
// f_j = s_j xf_j / T with xf_j t's orthonormal coordinates and s_j the product's factor (sqrt(T) for the real
// frequencies, sqrt(T / 2) for the pairs): |f_j| <= max |t|.
at::Tensor analysis(const at::Tensor& t, int T, const std::vector<double>& Q, cudaStream_t stream) {
  const int64_t M = t.size(0), n = t.size(1) / T;
  at::Tensor f = at::empty({M, T * n}, t.options());
  GroupDftTParams p{t.data_ptr(), f.data_ptr(), nullptr, M, n, 0, T, {}};
  for (int j = 0; j < T; ++j) {
    const double s = real_plane(j, T) ? std::sqrt(double(T)) : std::sqrt(T / 2.0);
    for (int u = 0; u < T; ++u) p.q[j * T + u] = static_cast<float>(s * Q[size_t(j) * T + u] / T);
  }
  const cudaError_t err = eq_group_dft_t_analysis(p, elem_of(t.scalar_type()), stream);
  TORCH_CHECK(err == cudaSuccess, "eq_linear_t: group DFT failed: ", cudaGetErrorString(err));
  return f;
}

// y (M, T d) of x (M, T c) contiguous, planes (T, d, c) contiguous (the adjoint's (T, c, d) for grad_x), bias
// (d,) contiguous or undefined, all one dtype. f_j = s_j xf_j / T (analysis) and the weights T P_j (exact: a
// power of two), so yf_j = f_j (T P_j)^T for the reals and [yf_r | yf_i] = [f_r | f_i] T [[P_r, P_i], [-P_i,
// P_r]]^T per pair.
at::Tensor forward_t(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& b, cudaStream_t stream) {
  const int T = static_cast<int>(planes.size(0));
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2), pairs = (T - 1) / 2;
  const std::vector<double> Q = dft_basis(T);
  const at::Tensor f = analysis(x, T, Q, stream);

  // The products, FP32, into the column blocks of a (M, T d): the two real frequencies as one batched GEMM
  // (blocks 0 and T - 1), the cos / sin pairs as another ([f_r | f_i] (M, 2c) by a (2c, 2d) block each).
  const at::Tensor w = planes * static_cast<double>(T);
  at::Tensor a = at::empty({M, T * d}, x.options().dtype(at::kFloat));
  at::Tensor a_real = a.as_strided({2, M, d}, {(T - 1) * d, T * d, 1});
  gemm_fp32_out(a_real, f.as_strided({2, M, c}, {(T - 1) * c, T * c, 1}),
                w.as_strided({2, c, d}, {(T - 1) * d * c, 1, c}));  // [P_0, P_{T-1}]^T
  if (pairs > 0) {
    const at::Tensor pr = w.narrow(0, 1, 2 * pairs).view({pairs, 2, d, c}).select(1, 0);
    const at::Tensor pi = w.narrow(0, 1, 2 * pairs).view({pairs, 2, d, c}).select(1, 1);
    const at::Tensor block = at::cat({at::cat({pr, pi}, 2), at::cat({-pi, pr}, 2)}, 1);  // (pairs, 2d, 2c)
    at::Tensor a_pair = a.as_strided({pairs, M, 2 * d}, {2 * d, T * d, 1}, a.storage_offset() + d);
    gemm_fp32_out(a_pair, f.as_strided({pairs, M, 2 * c}, {2 * c, T * c, 1}, f.storage_offset() + c),
                  block.transpose(1, 2));
  }

  // The synthesis with the bias, one rounding: y (M, d, T).
  at::Tensor y = at::empty({M, T * d}, x.options());
  GroupDftTParams sp{a.data_ptr<float>(), y.data_ptr(), b.defined() ? b.data_ptr() : nullptr, M, d, T * d, T, {}};
  for (int i = 0; i < T * T; ++i) sp.q[i] = static_cast<float>(Q[size_t(i)]);
  const cudaError_t err = eq_group_dft_t_synthesis(sp, elem_of(x.scalar_type()), stream);
  TORCH_CHECK(err == cudaSuccess, "eq_linear_t: inverse group DFT failed: ", cudaGetErrorString(err));
  return y;
}

// The planes' gradient (T, d, c) in FP32 from grad_y (M, T d) and x (M, T c), contiguous: with g_j, f_j their
// analysis (s_j / T times the orthonormal coordinates), the gradient of the products above is
// (T^2 / s_j) g_j^T f_j for the reals and, per pair, (T^2 / s) (g_r^T f_r + g_i^T f_i) and
// (T^2 / s) (g_r^T f_i - g_i^T f_r) (flash_eqlinear.reference.fourier_eq_linear_backward).
at::Tensor planes_grad_t(const at::Tensor& gy, const at::Tensor& x, int T, const std::vector<double>& Q,
                         cudaStream_t stream) {
  const int64_t M = x.size(0), c = x.size(1) / T, d = gy.size(1) / T, pairs = (T - 1) / 2;
  const at::Tensor f = analysis(x, T, Q, stream), g = analysis(gy, T, Q, stream);
  const auto fp32 = gy.options().dtype(at::kFloat);
  at::Tensor gp = at::empty({T, d, c}, fp32);
  at::Tensor real = at::empty({2, d, c}, fp32);
  gemm_fp32_out(real, g.as_strided({2, d, M}, {(T - 1) * d, 1, T * d}),
                f.as_strided({2, M, c}, {(T - 1) * c, T * c, 1}));
  const double t2 = double(T) * T;
  gp.select(0, 0).copy_(real.select(0, 0) * (t2 / std::sqrt(double(T))));
  gp.select(0, T - 1).copy_(real.select(0, 1) * (t2 / std::sqrt(double(T))));
  if (pairs > 0) {  // [[g_r^T f_r, g_r^T f_i], [g_i^T f_r, g_i^T f_i]] (pairs, 2d, 2c), one GEMM per pair
    at::Tensor blk = at::empty({pairs, 2 * d, 2 * c}, fp32);
    gemm_fp32_out(blk, g.as_strided({pairs, 2 * d, M}, {2 * d, 1, T * d}, g.storage_offset() + d),
                  f.as_strided({pairs, M, 2 * c}, {2 * c, T * c, 1}, f.storage_offset() + c));
    const double k = t2 / std::sqrt(T / 2.0);
    const auto part = [&](int i, int j) { return blk.narrow(1, i * d, d).narrow(2, j * c, c); };
    at::Tensor pr_pi = gp.narrow(0, 1, 2 * pairs).view({pairs, 2, d, c});
    pr_pi.select(1, 0).copy_((part(0, 0) + part(1, 1)) * k);
    pr_pi.select(1, 1).copy_((part(0, 1) - part(1, 0)) * k);
  }
  return gp;
}

}  // namespace

at::Tensor eq_linear_fwd_t(const at::Tensor& x_in, const at::Tensor& planes_in, const std::optional<at::Tensor>& bias) {
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  check_fwd_t_args(x_in, planes_in, b, "eq_linear_fwd_t");
  const c10::cuda::CUDAGuard guard(x_in.device());
  return forward_t(x_in.contiguous(), planes_in.contiguous(), b, at::cuda::getCurrentCUDAStream());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_t(const at::Tensor& grad_y, const at::Tensor& x_in,
                                                               const at::Tensor& planes_in, bool needs_x,
                                                               bool needs_p, bool needs_b) {
  check_fwd_t_args(x_in, planes_in, at::Tensor(), "eq_linear_bwd_t");
  const int64_t T = planes_in.size(0), d = planes_in.size(1);
  TORCH_CHECK_VALUE(grad_y.dim() == 2 && grad_y.size(0) == x_in.size(0) && grad_y.size(1) == T * d,
                    "eq_linear_bwd_t: grad_y must be (M, T*d) = (", num(x_in.size(0)), ", ", num(T * d), "), got ",
                    shape(grad_y.sizes()));
  TORCH_CHECK(grad_y.scalar_type() == x_in.scalar_type() && grad_y.device() == x_in.device(),
              "eq_linear_bwd_t: grad_y must have x's dtype and device");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor gy = grad_y.contiguous(), x = x_in.contiguous(), planes = planes_in.contiguous();
  at::Tensor gx, gp, gb;
  if (needs_x) {  // the forward with the adjoint planes (T, c, d): transposed, the sin planes negated
    at::Tensor adj = planes.transpose(1, 2).contiguous();
    adj.slice(0, 2, T - 1, 2).neg_();
    gx = forward_t(gy, adj, at::Tensor(), stream);
  }
  if (needs_p) {
    const int t = static_cast<int>(T);
    gp = planes_grad_t(gy, x, t, dft_basis(t), stream).to(planes.scalar_type());
  }
  if (needs_b) gb = gy.view({gy.size(0), d, T}).sum(at::IntArrayRef{0, 2}, false, at::kFloat).to(gy.scalar_type());
  return {or_empty(gx, gy.options()), or_empty(gp, gy.options()), or_empty(gb, gy.options())};
}

}  // namespace flash_eqlinear
