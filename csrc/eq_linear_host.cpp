// Host algorithms of the p4 layer: the GEMM forms (group DFT, cuBLAS plane products, inverse DFT), their
// row chunks, 3xTF32, the Hopper forward's launch with its optional outputs, the fused weight gradient's
// launch and the GEMM-form backward. Which of them runs is eq_linear_plan.cpp's decision; the ops that
// follow it are in eq_linear_fwd_api.cpp and eq_linear_bwd_api.cpp.
#include "eq_linear_host.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "eq_group_dft.h"
#include "eq_linear_bwd_weight.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_plane_blocks.h"
#include "eq_switches.h"

namespace flash_eqlinear {

// [[PR, -PI], [PI, PR]] (2d, 2c) of planes (4, d, c): the complex plane product as one real GEMM,
// [aR | aI] = [fR | fI] [[PR, -PI], [PI, PR]]^T. One launch (eq_plane_blocks.h).
at::Tensor complex_block(const at::Tensor& p) {
  const at::Tensor pc = p.contiguous();
  const int64_t d = pc.size(1), c = pc.size(2);
  at::Tensor out = at::empty({2 * d, 2 * c}, pc.options());
  const cudaError_t err = eq_complex_block(pc.data_ptr(), out.data_ptr(), d, c, static_cast<int>(pc.element_size()),
                                           at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flash_eqlinear: complex block failed: ", cudaGetErrorString(err));
  return out;
}

// (P0, PR, (PI - PR) / 2, (PR + PI) / 2, P2) (5, d, c) of contiguous planes (4, d, c): the operand planes
// of the complex pair as three products. One launch (eq_plane_blocks.h).
at::Tensor gauss_planes(const at::Tensor& pc) {
  const int64_t d = pc.size(1), c = pc.size(2);
  at::Tensor out = at::empty({5, d, c}, pc.options());
  const cudaError_t err = eq_gauss_planes(pc.data_ptr(), out.data_ptr(), d, c, static_cast<int>(pc.element_size()),
                                          pc.scalar_type() == at::kBFloat16, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flash_eqlinear: three-product planes failed: ", cudaGetErrorString(err));
  return out;
}

// y (M, d, 4) = inverse DFT of a (M, 4d) FP32 column blocks [a0 | a2 | aR | aI] + bias, in y's dtype
// (halved: a holds half the products, eq_group_dft.h): the last pass of the GEMM-form forwards (TF32,
// 3xTF32, fp16 / bf16) and of the GEMM-form grad_x; `what` names the caller.
// With gauss: a (M, 5d) = [a0 | a2 | k1 | k2 | k3], the complex pair as three products (eq_group_dft.h).
void inverse_dft_into(const at::Tensor& a, const at::Tensor& bias, at::Tensor& y, const char* what,
                      bool halved, bool gauss) {
  const int64_t M = a.size(0), d = a.size(1) / (gauss ? 5 : 4);
  GroupIdftParams ip{a.data_ptr<float>(), bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr(), M, d, a.size(1),
                     halved, gauss};
  const cudaError_t err = eq_group_idft(ip, static_cast<int>(y.element_size()), y.scalar_type() == at::kBFloat16,
                                        at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, what, ": inverse DFT failed: ", cudaGetErrorString(err));
}

// out = a b (mm, or bmm for batches) with FP32 output: FP32 operands as they are (TF32 as PyTorch's switch
// says), 16-bit ones with FP32 products (one rounding, in the inverse DFT).
void gemm_fp32_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat)
    a.dim() == 3 ? at::bmm_out(out, a, b) : at::mm_out(out, a, b);
  else
    a.dim() == 3 ? at::bmm_out(out, a, b, at::kFloat) : at::mm_out(out, a, b, at::kFloat);
}

// The plane products of the forward as cuBLAS GEMMs, then the inverse DFT: f (M, 4k) holds the input's
// Fourier column blocks [f0 | f2 | fR | fI] / 2 (halved: fp16 range; f's dtype is the GEMMs' operand
// type), planes (4, d, c) with (n, k) = (d, c). With `adjoint`: the products with the adjoint planes
// (transposed, PI negated) for grad_x, f = grad_y's unscaled planes (shared with the weight
// gradient), (n, k) = (c, d); they need no copy: the adjoint's GEMM operands are the planes themselves
// and complex_block(planes). planes must be contiguous.
// Two GEMM calls with FP32 output into the column blocks [a0 | a2 | aR | aI] of one (M, 4n) FP32
// buffer: a0 and a2 batched, the complex pair as one GEMM with K = 2k: [aR | aI] = [fR | fI]
// [[PR, -PI], [PI, PR]]^T (adjoint: [fR | fI] [[PR, -PI], [PI, PR]]); then y (M, 4n) = inverse DFT
// + bias, rounded once to y's dtype.
// With `gauss` (the forward only), the complex pair as three real products: f (M, 5k) =
// [f0/2 | f2/2 | s/4 | fR/2 | fI/2] with s = fR + fI (group_dft with gauss); k1 = (s/4) PR^T,
// k2 = (fR/2) ((PI - PR)/2)^T, k3 = (fI/2) ((PR + PI)/2)^T as one strided-batched GEMM (the three A
// blocks, the three B planes of gauss_planes and the three outputs are k / nk / n apart) into a (M, 5n)
// = [a0 | a2 | k1 | k2 | k3]; the inverse DFT forms aR = 2 (k1 - k3), aI = 2 (k1 + k2) (halved
// convention). The quarter and halves keep the new 16-bit operands within the range of the existing
// ones: |s/4| <= max |x|, and the plane combinations, formed in FP32 and rounded once, within max |P|.
// 5/16 of the dense MACs instead of 6/16 for one more x-sized block written and read (plan_three_products;
// docs/performance.md).
// With gauss, planes are gauss_planes(planes) (5, d, c) (fwd_gemm_form_chunked makes them once for
// its chunks); without, cblock may be complex_block(planes) already (made once for row chunks).
void fourier_products_into(const at::Tensor& f, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                           const char* what, bool adjoint, bool gauss,
                           const at::Tensor& cblock) {
  TORCH_INTERNAL_ASSERT(!(adjoint && gauss), what, ": three products are the forward's only");
  TORCH_INTERNAL_ASSERT(planes.size(0) == (gauss ? 5 : 4), what, ": planes for ", gauss ? "three" : "four",
                        " products");
  const int64_t M = f.size(0), n = planes.size(adjoint ? 2 : 1), k = planes.size(adjoint ? 1 : 2);
  const int64_t nb = gauss ? 5 : 4;  // column blocks of f and a
  at::Tensor a = at::empty({M, nb * n}, f.options().dtype(at::kFloat));
  const auto b = [&](const at::Tensor& w) { return adjoint ? w : w.transpose(-2, -1); };
  // a0 and a2 as one strided-batched GEMM (one host call): [f0, f2] (batch stride k) times
  // [P0, P2] (planes 0 and 3, of gauss_planes 0 and 4: the first and the last) into [a0, a2] (batch
  // stride n).
  at::Tensor a02 = a.as_strided({2, M, n}, {n, nb * n, 1});
  gemm_fp32_out(a02, f.as_strided({2, M, k}, {k, nb * k, 1}),
                b(planes.as_strided({2, planes.size(1), planes.size(2)},
                                    {(nb - 1) * planes.stride(0), planes.stride(1), 1})));
  if (gauss) {
    at::Tensor a3 = a.as_strided({3, M, n}, {n, 5 * n, 1}, a.storage_offset() + 2 * n);
    gemm_fp32_out(a3, f.as_strided({3, M, k}, {k, 5 * k, 1}, f.storage_offset() + 2 * k),
                  b(planes.narrow(0, 1, 3)));
  } else {
    at::Tensor ari = a.narrow(1, 2 * n, 2 * n);
    gemm_fp32_out(ari, f.narrow(1, 2 * k, 2 * k), b(cblock.defined() ? cblock : complex_block(planes)));
  }
  inverse_dft_into(a, bias, y, what, !adjoint, gauss);
}

// Group DFT of t (M, 4n) (contiguous, aligned to 4 elements) into Fourier planes, layouts in
// eq_group_dft.h: column blocks (M, 4n) with `blocks` (with gauss (M, 5n): a third block (fR + fI) / 2),
// else planes (4, M, n). With sum, also the FP32 column sums of the unrounded f0 per chunk of rows,
// (chunks, n), to be summed over the chunks in order; else an empty (0,). `what` names the caller in
// errors; halve: eq_group_dft.h.
std::tuple<at::Tensor, at::Tensor> group_dft(const at::Tensor& t, bool input, bool blocks, bool sum,
                                             const char* what, bool halve, bool gauss) {
  const int64_t M = t.size(0), n = t.size(1) / 4;
  at::Tensor out = blocks ? at::empty({M, (gauss ? 5 : 4) * n}, t.options()) : at::empty({4, M, n}, t.options());
  const auto f32 = t.options().dtype(at::kFloat);
  if (M == 0) return {out, sum ? at::zeros({1, n}, f32) : at::empty({0}, f32)};
  GroupDftParams p{t.data_ptr(), out.data_ptr(), M, n, input, blocks, halve, gauss};
  const int elem = static_cast<int>(t.element_size());
  at::Tensor sums;
  if (sum) {
    p.sum_chunks = eq_group_dft_sum_chunks(p, elem);
    TORCH_CHECK(p.sum_chunks > 0, what, ": device query failed");
    sums = at::empty({p.sum_chunks, n}, f32);
    p.sums = sums.data_ptr<float>();
  }
  const cudaError_t err = eq_group_dft(p, elem, t.scalar_type() == at::kBFloat16, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, what, ": group DFT failed (M=", num(M), ", n=", num(n), "): ",
              cudaGetErrorString(err));
  return {out, sum ? sums : at::empty({0}, f32)};
}

// The GEMM form of the forward: the group DFT of x (contiguous) into column blocks [f0 | f2 | fR | fI] / 2
// of one (M, 4c) buffer, then fourier_products_into (cuBLAS GEMMs in two calls and the inverse DFT +
// bias pass) into y; returns x's planes (eq_linear_fwd_xf keeps them). Taken for FP32 when PyTorch
// allows TF32 for matmuls (the switch F.linear follows) and the fused Hopper kernel does not apply
// (other GPUs, FLASH_EQLINEAR_SM90=0, shapes) or is slower (large layers): two extra passes over x-sized
// and y-sized FP32 buffers (a workspace of 4 M (c + d) floats) buy cuBLAS's TF32 rate for the 6/16 of
// the dense MACs; and for fp16 / bf16 where the plan says (FwdPath::kGemm16). `what` names the caller in
// errors.
// With gauss (the inference forward: the planes are not kept), the complex pair as three products
// (fourier_products_into; planes = gauss_planes of the layer's) and x's planes with a fifth block, (M, 5c).
at::Tensor fwd_gemm_form(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                         const char* what, bool gauss, const at::Tensor& cblock) {
  at::Tensor xf = std::get<0>(group_dft(aligned16(x), false, true, false, what, true, gauss));
  fourier_products_into(xf, planes, bias, y, what, false, gauss, cblock);
  return xf;
}

// Rows per chunk of the GEMM forms' row-chunked passes (the inference forward, grad_x) for row_bytes
// of workspace per row: at most FLASH_EQLINEAR_DEBUG workspace_mb (default 2048) MB at once, however large M
// is, in multiples of 128 rows (16-byte aligned row offsets) but never fewer than 1024 (the GEMMs stay
// large; where 1024 rows alone need more than the cap, the chunks exceed it). Each chunk costs a tail, so
// the default cap, 2 GB, leaves one chunk for every benchmarked layer but TF32 at c = 2048 (two; timings
// in docs/performance.md).
int64_t gemm_form_chunk_rows(int64_t row_bytes) {
  int64_t mb = 2048;
  if (const char* v = debug_switch("workspace_mb"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    mb = std::strtoll(v, &end, 10);
    TORCH_CHECK(*end == '\0' && mb > 0 && mb < (int64_t(1) << 40),
                "FLASH_EQLINEAR_DEBUG workspace_mb must be a positive number of megabytes, got '", v, "'");
  }
  return std::max<int64_t>(1024, (mb << 20) / row_bytes / 128 * 128);
}

// The inference forward's GEMM form (x's planes not kept) in row chunks (gemm_form_chunk_rows): its
// workspace, x's planes and the FP32 products, would otherwise be 5 M (c + d) floats at once for FP32
// with three products, 2.7 GB at M = 32768, c = d = 2048, growing with M. With gauss, the five planes
// (or, with four, the complex block) are made once for all chunks.
void fwd_gemm_form_chunked(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                           const char* what, bool gauss) {
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2);
  const int64_t rows =
      gemm_form_chunk_rows((gauss ? 5 : 4) * (c * x.element_size() + d * int64_t(sizeof(float))));
  const at::Tensor w = gauss ? gauss_planes(planes) : planes;
  const at::Tensor cblock = gauss ? at::Tensor() : complex_block(planes);
  for (int64_t r0 = 0; r0 < M; r0 += rows) {
    const int64_t n = std::min(rows, M - r0);
    at::Tensor yc = y.narrow(0, r0, n);
    fwd_gemm_form(x.narrow(0, r0, n), w, bias, yc, what, gauss, cblock);
  }
}
// fp16 / bf16 (M, 4k) through the sm_90a forward kernel with planes (4, n, k) (n output channels), if
// it runs for these tensors; else nothing is launched and false is returned. With xf (M, 4k), the kernel
// also writes x's Fourier planes [f0 | f2 | fR | fI] * xf_scale there, and with xf_sums
// (eq_linear_fwd_sm90_sum_rows(M), k) FP32 partial column sums of f0 (FwdParams); with gelu (and no xf),
// y = GELU(the product). y may be FP32 (without xf and gelu): the product stored unrounded.
bool fwd_sm90_16bit(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                    const at::Tensor& xf, float xf_scale, const at::Tensor& xf_sums,
                    bool gelu, at::TensorList x_more, at::TensorList y_more) {
  const int64_t M = x.size(0), n = planes.size(1), k = planes.size(2);
  if (M == 0) return true;
  FwdParams p{x.data_ptr(), planes.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr(), M, k, n};
  p.gelu = gelu;
  p.y_f32 = y.scalar_type() == at::kFloat;
  // x and / or y in parts (FwdParams::x_parts, y_parts): x, y are the first, x_more, y_more the others
  p.x_parts = 1 + static_cast<int>(x_more.size());
  p.y_parts = 1 + static_cast<int>(y_more.size());
  if (x_more.size() > 0) p.x1 = x_more[0].data_ptr();
  if (x_more.size() > 1) p.x2 = x_more[1].data_ptr();
  if (y_more.size() > 0) p.y1 = y_more[0].data_ptr();
  if (y_more.size() > 1) p.y2 = y_more[1].data_ptr();
  if (xf.defined()) {
    p.xf = xf.data_ptr();
    p.xf_scale = xf_scale;
    if (xf_sums.defined()) p.xf_sums = xf_sums.data_ptr<float>();
  }
  bool launched = false;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = x.scalar_type() == at::kHalf ? eq_linear_fwd_sm90_fp16(p, stream, &launched)
                                                       : eq_linear_fwd_sm90_bf16(p, stream, &launched);
  TORCH_CHECK(err == cudaSuccess, "flash_eqlinear: Hopper kernel launch failed (M=", num(M), ", in=", num(k),
              ", out=", num(n), "): ", cudaGetErrorString(err));
  return launched;
}

// Opt-in split-precision FP32 (FLASH_EQLINEAR_FP32=3xtf32): x's Fourier planes and the weight planes
// split into TF32 hi + lo parts, each product as hi*hi + lo*hi + hi*lo on TF32 tensor cores (the
// lo*lo term, ~2^-22 relative, dropped). Then the inverse DFT + bias pass. Used for c * d >=
// 2^18 (eq_linear_plan.cpp), where it beats the exact SIMT kernel; smaller layers stay exact.
// Accuracy: the tensor cores accumulate in FP32 without round-to-nearest, so a GEMM's error grows
// linearly with its K. Hence the two correction terms (2^-11 of the result) in one GEMM of their own,
// then the hi*hi product in K chunks of max(256, K / 8), each added to the output by the GEMM epilogue
// (FP32, round to nearest): the accumulation error no longer grows like K (docs/performance.md). Each
// chunk re-reads and re-writes the FP32 product.
constexpr int64_t kSplitChunkMin = 256;

// TF32 on for the GEMMs of the split product, whatever the user's setting (restored on exit).
struct Tf32Scope {
  bool prev = at::globalContext().allowTF32CuBLAS();
  Tf32Scope() { at::globalContext().setAllowTF32CuBLAS(true); }
  ~Tf32Scope() { at::globalContext().setAllowTF32CuBLAS(prev); }
};

void eq_linear_fwd_3xtf32(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y) {
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor xs = aligned16(x);
  at::Tensor xf = at::empty({M, 8 * c}, x.options());  // [f0 h|f0 l|f2 h|f2 l|fR h|fI h|fR l|fI l]
  cudaError_t err = eq_group_dft_split_fp32(xs.data_ptr<float>(), xf.data_ptr<float>(), M, c, stream);
  TORCH_CHECK(err == cudaSuccess, "eq_linear_fwd (3xtf32): group DFT failed: ", cudaGetErrorString(err));
  // Planes: hi = rounded to TF32 (to nearest, ties away: +0x1000 then clear the 13 low bits), lo = rest.
  const at::Tensor hi = at::bitwise_and(planes.view(at::kInt) + 0x1000, -8192).view(at::kFloat);
  const at::Tensor lo = planes - hi;
  at::Tensor a = at::empty({M, 4 * d}, x.options());
  {
    const Tf32Scope tf32;
    // (output column, width, x column of [hi | lo], K, hi and lo of the planes' matrix)
    const auto product = [&](int64_t col, int64_t n, int64_t fcol, int64_t k, const at::Tensor& wh,
                             const at::Tensor& wl) {
      at::Tensor out = a.narrow(1, col, n);
      at::mm_out(out, xf.narrow(1, fcol, 2 * k), at::cat({wl, wh}, 1).t());  // hi*lo + lo*hi
      const int64_t chunk = std::max(kSplitChunkMin, k / 8);
      for (int64_t k0 = 0; k0 < k; k0 += chunk) {
        const int64_t kc = std::min(chunk, k - k0);
        out.addmm_(xf.narrow(1, fcol + k0, kc), wh.narrow(1, k0, kc).t());  // hi*hi, one chunk
      }
    };
    product(0, d, 0, c, hi.select(0, 0), lo.select(0, 0));
    product(d, d, 2 * c, c, hi.select(0, 3), lo.select(0, 3));
    product(2 * d, 2 * d, 4 * c, 2 * c, complex_block(hi), complex_block(lo));
  }
  inverse_dft_into(a, bias, y, "eq_linear_fwd (3xtf32)");
}

// Weight gradients: x (M, 4c), grad_y (M, 4d) -> (grad_planes (4, d, c), grad_bias (d,)), in the
// inputs' dtype (float32, float16 or bfloat16). With adj_of (planes (4, d, c), contiguous, of that dtype), the
// same launches also make its adjoint planes (4, c, d) for grad_x (eq_adjoint_planes) into *adj.
// gy_more (fp16 / bf16): grad_y's further parts (BwdWeightParams::gy_parts), grad_y being the first; where the
// kernels do not take them, nothing runs and *unsupported is set (the caller joins the parts).
std::tuple<at::Tensor, at::Tensor> weight_grads(const at::Tensor& x, const at::Tensor& grad_y,
                                                const at::Tensor* adj_of, at::Tensor* adj,
                                                at::TensorList gy_more, bool* unsupported) {
  TORCH_CHECK(x.is_cuda() && grad_y.is_cuda() && x.device() == grad_y.device(),
              "eq_linear_bwd_weight: x and grad_y must be CUDA tensors on one device, got ",
              x.device().str(), " and ", grad_y.device().str());
  TORCH_CHECK(x.dim() == 2 && grad_y.dim() == 2 && x.size(0) == grad_y.size(0) && x.size(1) % 4 == 0 &&
                  grad_y.size(1) % 4 == 0 && x.size(1) > 0 && grad_y.size(1) > 0,
              "eq_linear_bwd_weight: expected x (M, 4c) and grad_y (M, 4d), got ", shape(x.sizes()),
              " and ", shape(grad_y.sizes()));
  const auto dtype = x.scalar_type();
  TORCH_CHECK(kernel_dtype(dtype) && grad_y.scalar_type() == dtype,
              "eq_linear_bwd_weight: x and grad_y must share one dtype among float32, float16, bfloat16, got ",
              c10::toString(dtype), " and ", c10::toString(grad_y.scalar_type()));
  check_device_supported(x);
  const at::cuda::CUDAGuard guard(x.device());
  // The tensor-core kernels read 16-byte chunks: a view at an odd offset is copied (fresh
  // allocations are aligned).
  const auto prepared = [dtype](const at::Tensor& t) {
    at::Tensor u = t.contiguous();
    if (dtype != at::kFloat && reinterpret_cast<uintptr_t>(u.data_ptr()) % 16 != 0) u = u.clone();
    return u;
  };
  const at::Tensor xc = prepared(x), gc = prepared(grad_y);
  const int64_t parts = 1 + static_cast<int64_t>(gy_more.size());
  const int64_t M = x.size(0), c = x.size(1) / 4, d = grad_y.size(1) / 4 * parts;
  at::Tensor grad_planes = at::empty({4, d, c}, x.options());
  at::Tensor grad_bias = at::empty({d}, x.options());
  const bool hopper = plan_weight_grad_hopper(c, d, elem_of(dtype), sm_major_of(x));
  const size_t ws_bytes = eq_linear_bwd_weight_workspace_bytes(M, c, d, static_cast<int>(x.element_size()),
                                                               x.get_device(), hopper);
  // Workspace from the caching allocator (float elements: 16-byte aligned allocations).
  at::Tensor ws = at::empty({static_cast<int64_t>((ws_bytes + 3) / 4)}, x.options().dtype(at::kFloat));
  BwdWeightParams p{xc.data_ptr(), gc.data_ptr(), grad_planes.data_ptr(), grad_bias.data_ptr(),
                    ws_bytes ? ws.data_ptr() : nullptr, ws_bytes, M, c, d};
  if (adj_of != nullptr && adj != nullptr) {
    *adj = at::empty({4, c, d}, x.options());
    p.planes = adj_of->data_ptr();
    p.adj = adj->data_ptr();
  }
  p.hopper = hopper;
  p.gy_parts = static_cast<int>(parts);
  if (parts > 1) p.gy1 = gy_more[0].data_ptr();
  if (parts > 2) p.gy2 = gy_more[1].data_ptr();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaError_t err;
  switch (dtype) {
    case at::kFloat: err = eq_linear_bwd_weight_fp32(p, stream); break;
    case at::kHalf: err = eq_linear_bwd_weight_fp16(p, stream); break;
    default: err = eq_linear_bwd_weight_bf16(p, stream); break;
  }
  if (err == cudaErrorNotSupported && parts > 1 && unsupported != nullptr) {  // nothing was launched
    *unsupported = true;
    return {};
  }
  TORCH_CHECK(err == cudaSuccess, "eq_linear_bwd_weight: kernel launch failed (M=", num(M), ", c=", num(c),
              ", d=", num(d), ", ", c10::toString(dtype), "): ", cudaGetErrorString(err));
  return {grad_planes, grad_bias};
}
// The adjoint planes (4, c, d) of planes (4, d, c): one kernel (transposed, PI negated).
at::Tensor adjoint_planes(const at::Tensor& planes) {
  const at::Tensor pc = planes.contiguous();
  const int64_t d = pc.size(1), c = pc.size(2);
  at::Tensor adj = at::empty({4, c, d}, planes.options());
  const cudaError_t err = eq_adjoint_planes(pc.data_ptr(), adj.data_ptr(), d, c, static_cast<int>(pc.element_size()),
                                            at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "eq_linear_bwd: adjoint planes failed: ", cudaGetErrorString(err));
  return adj;
}

// The GEMM form of the backward from grad_y (M, 4d, contiguous): grad_y's group DFT into column blocks
// [g0 | g2 | gR | gI] (with grad_bias from its column sums), grad_x from them when gx_gemm, and
// grad_planes from x's planes: with kept, t holds them as eq_linear_fwd_xf returned them ([f0 | f2 | fR
// | fI] / 2), else t is x and they are made here ([f0/2 | f2/2 | fR/r2 | fI/r2], group_dft's x layout;
// only when needs_p). Not-needed outputs stay as passed in.
// gf_made, g0_sums: grad_y's planes and g0's partial column sums if grad_x's kernel wrote them
// (grad_x_hopper_planes), else undefined; grad_bias then sums g0_sums.
void bwd_from_planes(const at::Tensor& gy, const at::Tensor& gf_made, const at::Tensor& g0_sums,
                     const at::Tensor& t, bool kept,
                     const at::Tensor& planes, bool gx_gemm, bool needs_p, bool needs_b, at::Tensor& gx,
                     at::Tensor& gp, at::Tensor& gb) {
  const int64_t M = gy.size(0), d = planes.size(1), c = planes.size(2);
  check_device_supported(gy);
  const bool made = gf_made.defined();
  const auto [gf, sums] = made ? std::make_tuple(gf_made, at::Tensor())
                               : group_dft(aligned16(gy), false, true, needs_b, "eq_linear_bwd");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int elem = static_cast<int>(gy.element_size());
  const bool bf16 = gy.scalar_type() == at::kBFloat16;
  cudaError_t err = cudaSuccess;
  if (gx_gemm) {  // in row chunks: the FP32 products, 4 M c floats, are the workspace
    gx = at::empty({M, 4 * c}, gy.options());
    const at::Tensor pc = planes.contiguous();
    const int64_t rows = gemm_form_chunk_rows(4 * c * int64_t(sizeof(float)));
    const at::Tensor cblock = complex_block(pc);
    for (int64_t r0 = 0; r0 < M; r0 += rows) {
      const int64_t n = std::min(rows, M - r0);
      at::Tensor gxc = gx.narrow(0, r0, n);
      fourier_products_into(gf.narrow(0, r0, n), pc, at::Tensor(), gxc, "eq_linear_bwd (grad_x)", true, false,
                            cblock);
    }
  }
  if (needs_p) {
    const at::Tensor xf = kept ? t.contiguous()
                               : std::get<0>(group_dft(aligned16(t.contiguous()), true, true, false, "eq_linear_bwd"));
    gp = at::empty({4, d, c}, gy.options());
    // P0 = g0^T f0 / 2 and P2 = g2^T f2 / 2 as one strided-batched GEMM into planes 0 and 3.
    at::Tensor gp03 = gp.as_strided({2, d, c}, {3 * d * c, c, 1});
    at::bmm_out(gp03, gf.as_strided({2, d, M}, {d, 1, 4 * d}), xf.as_strided({2, M, c}, {c, 4 * c, 1}));
    // The complex pair in one FP32 product of the stored blocks, q = [gR | gI]^T [fR | fI] = [[gR^T fR,
    // gR^T fI], [gI^T fR, gI^T fI]], then PR = s (q00 + q11), PI = s (q10 - q01) (one rounding each) with s
    // completing the pair's scale to 1/r2: PR = (gR^T fR + gI^T fI) / r2 in unscaled planes.
    const at::Tensor gri = gf.narrow(1, 2 * d, 2 * d).t(), fri = xf.narrow(1, 2 * c, 2 * c);
    const at::Tensor q = gy.scalar_type() == at::kFloat ? at::mm(gri, fri) : at::mm(gri, fri, at::kFloat);
    const float scale = kept ? 1.41421356237309515f : 1.f;  // (1/2) * r2 = 1/r2
    err = eq_pair_combine(q.data_ptr<float>(), gp.select(0, 1).data_ptr(), gp.select(0, 2).data_ptr(), d, c, scale,
                          elem, bf16, stream);
    TORCH_CHECK(err == cudaSuccess, "eq_linear_bwd: pair combine failed: ", cudaGetErrorString(err));
  }
  if (needs_b) {  // column sums of f0's FP32 partial sums: g0_sums (many rows) or the group DFT's (few)
    gb = at::empty({d}, gy.options());
    if (made) {
      const int64_t rows = g0_sums.size(0);
      const at::Tensor partial = at::empty({eq_block_column_chunks(rows), d}, g0_sums.options());
      err = eq_block_column_sums(g0_sums.data_ptr<float>(), rows, d, partial.data_ptr<float>(), gb.data_ptr(),
                                 elem, bf16, stream);
    } else {
      err = eq_column_sums(sums.data_ptr<float>(), gb.data_ptr(), sums.size(0), d, elem, bf16, stream);
    }
    TORCH_CHECK(err == cudaSuccess, "eq_linear_bwd: column sums failed: ", cudaGetErrorString(err));
  }
}

}  // namespace flash_eqlinear
