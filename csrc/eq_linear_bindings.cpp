// Torch bindings: registers the fused kernels as real torch ops (flash_eqlinear::*), so that
// torch.compile traces them and autograd/fake implementations can be attached from Python.
#include <Python.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "eq_group_dft.h"
#include "eq_group_layer_norm.h"
#include "eq_linear_bwd_weight.h"
#include "eq_linear_fwd.h"
#include "eq_linear_fwd_narrow.h"
#include "eq_linear_fwd_sm90.h"
#include "eq_plane_blocks.h"

namespace flash_eqlinear {
namespace {

// Error messages are built from std::string pieces only: some toolchains link a private static
// libstdc++ into the extension whose iostream number formatting crashes (uninitialised locale),
// so integers and shapes are formatted with std::to_string instead of being streamed.
std::string num(int64_t v) { return std::to_string(v); }

std::string shape(at::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 ? ",)" : ")");
}

void check_device_supported(const at::Tensor& t) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(t.get_device());
  TORCH_CHECK(prop->major >= 8,
              "flash_eqlinear kernels need compute capability >= 8.0 (Ampere or newer); device ",
              num(t.get_device()), " (", prop->name, ") is sm_", num(prop->major), num(prop->minor),
              ". Set FLASH_EQLINEAR_BACKEND=reference to use the pure-PyTorch path.");
}

// The element types of the kernels.
bool kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// t, or where it was not computed (an output not needed) an empty (0,) tensor with options o: made only where
// needed, as allocations cost host time per call.
at::Tensor or_empty(const at::Tensor& t, const at::TensorOptions& o) { return t.defined() ? t : at::empty({0}, o); }

// x itself when 16-byte aligned (the group DFT kernels read float4 rows), else an aligned copy.
at::Tensor aligned16(const at::Tensor& x) {
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 ? x : x.clone();
}

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
                      bool halved = false, bool gauss = false) {
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
// 5/16 of the dense MACs instead of 6/16 for one more x-sized block written and read (H100, M = 32768:
// benchmarks/README.md, v14).
// With gauss, planes are gauss_planes(planes) (5, d, c) (fwd_gemm_form_chunked makes them once for
// its chunks); without, cblock may be complex_block(planes) already (made once for row chunks).
void fourier_products_into(const at::Tensor& f, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                           const char* what, bool adjoint = false, bool gauss = false,
                           const at::Tensor& cblock = at::Tensor()) {
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
                                             const char* what, bool halve = false, bool gauss = false) {
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
// the dense MACs; and for fp16 / bf16 as products_form says. `what` names the caller in errors.
// With gauss (the inference forward: the planes are not kept), the complex pair as three products
// (fourier_products_into; planes = gauss_planes of the layer's) and x's planes with a fifth block, (M, 5c).
at::Tensor fwd_gemm_form(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                         const char* what, bool gauss = false, const at::Tensor& cblock = at::Tensor()) {
  at::Tensor xf = std::get<0>(group_dft(aligned16(x), false, true, false, what, true, gauss));
  fourier_products_into(xf, planes, bias, y, what, false, gauss, cblock);
  return xf;
}

// Rows per chunk of the GEMM forms' row-chunked passes (the inference forward, grad_x) for row_bytes
// of workspace per row: at most FLASH_EQLINEAR_WORKSPACE_MB (default 2048) MB at once, however large M
// is, in multiples of 128 rows (16-byte aligned row offsets) but never fewer than 1024 (the GEMMs stay
// large; where 1024 rows alone need more than the cap, the chunks exceed it). Each chunk costs a tail:
// H100, M = 32768, caps of 512 MB / 1 GB / 2 GB / none: TF32 1.95 / 1.88 / 1.84 / 1.84 ms at c = 1024,
// 5.79 / 5.74 / 5.60 / 5.50 at c = 2048; fp16 (GEMM form forced) 1.24 / 1.16 / 1.16 / 1.15 at c = 1024
// (benchmarks/README.md, v15). So 2 GB by default: one chunk for every benchmarked layer but TF32 at
// c = 2048 (two).
int64_t gemm_form_chunk_rows(int64_t row_bytes) {
  int64_t mb = 2048;
  if (const char* v = std::getenv("FLASH_EQLINEAR_WORKSPACE_MB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    mb = std::strtoll(v, &end, 10);
    TORCH_CHECK(*end == '\0' && mb > 0 && mb < (int64_t(1) << 40),
                "FLASH_EQLINEAR_WORKSPACE_MB must be a positive number of megabytes, got '", v, "'");
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

// How fp16 / bf16 plane products are computed (the forward, and grad_x where the weight gradient takes
// the GEMM form): FLASH_EQLINEAR_PRODUCTS=fused (the fused kernels: the Hopper one where it runs, else
// mma.sync), =gemm (the GEMM form: the input's Fourier planes times the planes in cuBLAS GEMMs with
// FP32 products, then the inverse DFT; fourier_products_into), or auto (default): the Hopper kernel
// where it runs (for grad_x only below kGemmGradXMinCD output weights per plane), else the GEMM form
// from kGemmFwdMinCD (forward; grad_x whenever grad_y's planes exist), else mma.sync.
// H100, M = 32768, c = d (benchmarks/README.md, v8), with the input's group DFT: the GEMM form 0.46 /
// 1.12 / 3.41 ms against mma.sync 0.48 / 1.65 / 6.05 ms and the Hopper kernel 0.25 / 0.91 / 3.66 ms
// at c = 512 / 1024 / 2048; as grad_x the DFT is shared with the weight gradient, and at c = 2048 the
// whole backward is 2-5% faster with the GEMM form than with the Hopper kernel (7% slower at c = 1024).
constexpr int64_t kGemmFwdMinCD = int64_t(1) << 18;
// Weights per plane from which the inference forward's GEMM form takes the complex pair as three
// products (fourier_products_into with gauss): a sixth fewer MACs for one more x-sized block written and
// read, which pays where the GEMMs dominate. H100, M = 32768, c = d, against four products: TF32
// 1.84 / 5.44 ms against 1.92 / 6.30 at c = 1024 / 2048; fp16 (FLASH_EQLINEAR_SM90=0) 0.51 / 1.15 /
// 3.21 ms against 0.45 / 1.13 / 3.53 at c = 512 / 1024 / 2048 (bf16 alike). GPUs with less compute
// per byte of memory bandwidth than the H100 would gain from smaller sizes on; not measured.
constexpr int64_t kGaussMinCDTf32 = int64_t(1) << 20;
constexpr int64_t kGaussMinCD16 = int64_t(1) << 22;
constexpr int64_t kGemmGradXMinCD = int64_t(1) << 22;
enum class ProductsForm { kAuto, kFused, kGemm };
ProductsForm products_form() {
  const char* v = std::getenv("FLASH_EQLINEAR_PRODUCTS");
  if (v != nullptr && std::strcmp(v, "fused") == 0) return ProductsForm::kFused;
  if (v != nullptr && std::strcmp(v, "gemm") == 0) return ProductsForm::kGemm;
  return ProductsForm::kAuto;
}

// Whether a Hopper kernel may run on t's device (a cheap pre-check: the launchers check the rest).
bool hopper_kernels_may_run(const at::Tensor& t) {
  return sm90_path_enabled() && at::cuda::getDeviceProperties(t.get_device())->major == 9;
}

// Whether fp16 / bf16 plane products where the GEMM form is an option (grad_x next to the GEMM-form
// weight gradient, the planes-keeping training forward) go to the Hopper kernel: by default below
// kGemmGradXMinCD on Hopper devices (products_form).
bool hopper_takes_products(const at::Tensor& t, int64_t cd) {
  return products_form() == ProductsForm::kAuto && cd < kGemmGradXMinCD && hopper_kernels_may_run(t);
}

// fp16 / bf16 (M, 4k) through the sm_90a forward kernel with planes (4, n, k) (n output channels), if
// it runs for these tensors; else nothing is launched and false is returned. With xf (M, 4k), the kernel
// also writes x's Fourier planes [f0 | f2 | fR | fI] * xf_scale there, and with xf_sums
// (eq_linear_fwd_sm90_sum_rows(M), k) FP32 partial column sums of f0 (FwdParams); with gelu (and no xf),
// y = GELU(the product). y may be FP32 (without xf and gelu): the product stored unrounded.
bool fwd_sm90_16bit(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& bias, at::Tensor& y,
                    const at::Tensor& xf = at::Tensor(), float xf_scale = 1.f, const at::Tensor& xf_sums = at::Tensor(),
                    bool gelu = false, at::TensorList x_more = {}, at::TensorList y_more = {}) {
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
// kSplitMinCD, where it beats the exact SIMT kernel; smaller layers stay exact.
// Accuracy: the tensor cores accumulate in FP32 without round-to-nearest, so a GEMM's error grows
// linearly with its K. Measured on an H100 with each product as one GEMM over K = [hi | lo] (c = d =
// 512 .. 2048): relative error 5e-6 .. 2e-5, 6-12x the exact kernel's (5e-7 .. 1e-6). Hence: the two
// correction terms (2^-11 of the result) in one GEMM of their own, then the hi*hi product in K chunks
// of max(256, K / 8), each added to the output by the GEMM epilogue (FP32, round to nearest), so the
// accumulation error no longer grows like K while the exact kernel's grows like sqrt(K). An emulation
// (exact TF32 products, 8 per step, accumulator truncated to FP32 after each step; it reproduces the
// measured growth of the unchunked form) puts the chunked error at 1.5x / 1.1x / 1.3x the exact
// kernel's at c = 512 / 1024 / 2048; 256-wide chunks everywhere would give 1.5x / 1.1x / 0.75x at the
// price of twice the passes at c = 2048. Each chunk re-reads and re-writes the FP32 product.
constexpr int64_t kSplitMinCD = 1 << 18;
constexpr int64_t kSplitChunkMin = 256;

bool split_tf32_requested() {
  const char* v = std::getenv("FLASH_EQLINEAR_FP32");
  return v != nullptr && std::strcmp(v, "3xtf32") == 0;
}

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

// FP32 with TF32 allowed takes the fused Hopper kernel below this c * d. H100, M = 32768, c = d: fused 0.073
// / 0.54 / 1.95 / 7.44 ms at c = 128 / 512 / 1024 / 2048, DFT + cuBLAS 0.17 / 0.74 / 1.91 / 6.17 ms
// (cuBLAS's TF32 GEMMs outrun the fused kernel's m64n64 wgmma once the two extra passes are small next to
// the GEMMs).
constexpr int64_t kFusedTf32MaxCD = 1 << 19;

// The forward ops' shared body: x (M, 4c), planes (4, d, c), bias (d,) or None -> y (M, 4d); all one
// dtype, on one CUDA device (`what` names the op). With gelu, y = GELU(the layer's output) (exact erf
// form, of the output rounded to its dtype): the kernels with a GELU epilogue (the fp16 / bf16 Hopper and
// mma.sync kernels, the TF32 Hopper kernel; FwdParams::gelu) apply it as they store, the other forms (narrow
// kernel, exact FP32, 3xTF32, the GEMM forms) by at::gelu_ after. With f32_out (fp16 / bf16 tensors, not
// with gelu), y is FP32: the fp16 / bf16 Hopper and mma.sync kernels store it unrounded (FwdParams::y_f32),
// the narrow kernel and the GEMM forms write it in x's dtype, widened after.
at::Tensor fwd(const at::Tensor& x, const at::Tensor& planes, const std::optional<at::Tensor>& bias, bool gelu,
               const char* what, bool f32_out = false) {
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
  const auto low = [&]() -> const at::Tensor& {
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
  cudaError_t err = cudaSuccess;
  const std::string op = what;
  const bool tf32 = dtype == at::kFloat && at::globalContext().allowTF32CuBLAS();
  if (eq_linear_fwd_narrow_applies(p, static_cast<int>(x.element_size()), tf32)) {
    // Narrow layers: one streaming pass (FP32 in exact arithmetic also where TF32 is allowed).
    p.y = low().data_ptr();
    err = eq_linear_fwd_narrow(p, static_cast<int>(x.element_size()), dtype == at::kBFloat16, stream);
    TORCH_CHECK(err == cudaSuccess, op, ": narrow kernel launch failed (M=", num(M), ", c=", num(c), ", d=", num(d),
                "): ", cudaGetErrorString(err));
    return done(false);
  }
  if (dtype == at::kFloat && c * d >= kSplitMinCD && split_tf32_requested()) {
    eq_linear_fwd_3xtf32(xc, pc, b, y);
    return done(false);
  }
  if (tf32) {
    // TF32 allowed: the fused Hopper kernel where it applies and wins (kFusedTf32MaxCD), else the DFT +
    // cuBLAS form.
    bool launched = false;
    if (c * d < kFusedTf32MaxCD) err = eq_linear_fwd_sm90_tf32(pg, stream, &launched);
    TORCH_CHECK(err == cudaSuccess, op, ": TF32 kernel launch failed (M=", num(M), ", c=", num(c), ", d=", num(d),
                "): ", cudaGetErrorString(err));
    if (!launched) fwd_gemm_form_chunked(xc, pc, b, y, "eq_linear_fwd (tf32)", c * d >= kGaussMinCDTf32);
    return done(launched);
  }
  const ProductsForm form = products_form();
  const bool gemm_form = form == ProductsForm::kGemm || (form == ProductsForm::kAuto && c * d >= kGemmFwdMinCD);
  if (dtype != at::kFloat && gemm_form) {
    if (form == ProductsForm::kAuto && hopper_kernels_may_run(x) &&
        fwd_sm90_16bit(xc, pc, b, y, at::Tensor(), 1.f, at::Tensor(), gelu))
      return done(true);
    at::Tensor out = low();
    fwd_gemm_form_chunked(xc, pc, b, out, "eq_linear_fwd", c * d >= kGaussMinCD16);  // products_form
    return done(false);
  }
  switch (dtype) {
    case at::kFloat: err = eq_linear_fwd_fp32(p, stream); break;
    case at::kHalf: err = eq_linear_fwd_fp16(pg, stream); break;
    default: err = eq_linear_fwd_bf16(pg, stream); break;
  }
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed (M=", num(M), ", c=", num(c), ", d=", num(d), ", ",
              c10::toString(dtype), "): ", cudaGetErrorString(err));
  return done(dtype != at::kFloat);
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

// The training forward of the GEMM form: y as eq_linear_fwd's GEMM form computes it (fp16 / bf16, or
// FP32 with the GEMMs as PyTorch's TF32 switch says), and x's Fourier planes xf (M, 4c) = [f0 | f2 | fR |
// fI] / 2 (column blocks, eq_group_dft.h), which that form makes anyway, for the backward to keep
// instead of x (same size): eq_linear_bwd_xf then needs no group DFT of x. The caller decides when the
// GEMM form is the one to take (flash_eqlinear.ops).
std::tuple<at::Tensor, at::Tensor> eq_linear_fwd_xf(const at::Tensor& x, const at::Tensor& planes,
                                                    const std::optional<at::Tensor>& bias) {
  const at::Tensor b = checked_fwd_args(x, planes, bias, "eq_linear_fwd_xf");
  const int64_t M = x.size(0), d = planes.size(1), c = planes.size(2);
  const at::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({M, 4 * d}, x.options());
  if (M == 0) return {y, at::empty_like(x, at::MemoryFormat::Contiguous)};
  const at::Tensor xc = x.contiguous(), pc = planes.contiguous();
  // fp16 / bf16 on Hopper below the GEMM form's size (as grad_x, kGemmGradXMinCD): the Hopper kernel,
  // writing the planes as a by-product.
  if (x.scalar_type() != at::kFloat && hopper_takes_products(x, c * d)) {
    at::Tensor xf = at::empty({M, 4 * c}, x.options());
    if (fwd_sm90_16bit(xc, pc, b, y, xf, 0.5f)) return {y, xf};
  }
  const at::Tensor xf = fwd_gemm_form(xc, pc, b, y, "eq_linear_fwd_xf");
  return {y, xf};
}

// Weight gradients: x (M, 4c), grad_y (M, 4d) -> (grad_planes (4, d, c), grad_bias (d,)), in the
// inputs' dtype (float32, float16 or bfloat16). With adj_of (planes (4, d, c), contiguous, of that dtype), the
// same launches also make its adjoint planes (4, c, d) for grad_x (eq_adjoint_planes) into *adj.
// gy_more (fp16 / bf16): grad_y's further parts (BwdWeightParams::gy_parts), grad_y being the first; where the
// kernels do not take them, nothing runs and *unsupported is set (the caller joins the parts).
std::tuple<at::Tensor, at::Tensor> weight_grads(const at::Tensor& x, const at::Tensor& grad_y,
                                                const at::Tensor* adj_of = nullptr, at::Tensor* adj = nullptr,
                                                at::TensorList gy_more = {}, bool* unsupported = nullptr) {
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
  const size_t ws_bytes = eq_linear_bwd_weight_workspace_bytes(M, c, d, static_cast<int>(x.element_size()),
                                                               x.get_device());
  // Workspace from the caching allocator (float elements: 16-byte aligned allocations).
  at::Tensor ws = at::empty({static_cast<int64_t>((ws_bytes + 3) / 4)}, x.options().dtype(at::kFloat));
  BwdWeightParams p{xc.data_ptr(), gc.data_ptr(), grad_planes.data_ptr(), grad_bias.data_ptr(),
                    ws_bytes ? ws.data_ptr() : nullptr, ws_bytes, M, c, d};
  if (adj_of != nullptr && adj != nullptr) {
    *adj = at::empty({4, c, d}, x.options());
    p.planes = adj_of->data_ptr();
    p.adj = adj->data_ptr();
  }
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

// grad_x (M, 4c) of grad_y (M, 4d) by a fused kernel on the adjoint planes (transposed, PI negated),
// unless the GEMM form takes it: with gemm_ok (the weight gradient makes grad_y's Fourier planes anyway)
// for fp16 / bf16 as products_form says. Returns (grad_x, false), or (an empty tensor, true) when grad_x
// is left to the GEMM form (bwd_from_planes). With gf and the Hopper kernel, that kernel also writes
// grad_y's planes [g0 | g2 | gR | gI] (M, 4d) into *gf and g0's partial column sums in FP32 into *g0_sums
// (else both stay undefined). With f32 (fp16 / bf16 grad_y, not the GEMM form), grad_x is FP32 (fwd's
// f32_out). adj_made: the adjoint planes if made already (weight_grads), else undefined.
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

std::pair<at::Tensor, bool> grad_x_fused(const at::Tensor& gy, const at::Tensor& planes, bool gemm_ok, bool f32,
                                         at::Tensor* gf = nullptr, at::Tensor* g0_sums = nullptr,
                                         const at::Tensor& adj_made = at::Tensor()) {
  const bool may_gemm = gemm_ok && gy.scalar_type() != at::kFloat && products_form() != ProductsForm::kFused;
  const int64_t M = gy.size(0), c = planes.size(2), d = planes.size(1);
  // (No Hopper kernel to try on other devices or with FLASH_EQLINEAR_SM90=0: no adjoint copy.)
  if (may_gemm && !hopper_takes_products(gy, c * d)) return {at::Tensor(), true};
  check_device_supported(gy);
  const at::Tensor adj = adj_made.defined() ? adj_made : adjoint_planes(planes);
  if (!may_gemm) return {fwd(gy, adj, std::nullopt, false, "eq_linear_fwd", f32), false};
  at::Tensor gx = at::empty({M, 4 * c}, gy.options());
  const bool write = gf != nullptr && M > 0;
  const at::Tensor planes_out = write ? at::empty_like(gy, at::MemoryFormat::Contiguous) : at::Tensor();
  const at::Tensor sums = write ? at::empty({eq_linear_fwd_sm90_sum_rows(M), d}, gy.options().dtype(at::kFloat))
                                : at::Tensor();
  if (!fwd_sm90_16bit(gy, adj, at::Tensor(), gx, planes_out, 1.f, sums)) return {at::Tensor(), true};
  if (write) std::tie(*gf, *g0_sums) = std::make_tuple(planes_out, sums);
  return {gx, false};
}

// The GEMM form of the backward from grad_y (M, 4d, contiguous): grad_y's group DFT into column blocks
// [g0 | g2 | gR | gI] (with grad_bias from its column sums), grad_x from them when gx_gemm, and
// grad_planes from x's planes: with kept, t holds them as eq_linear_fwd_xf returned them ([f0 | f2 | fR
// | fI] / 2), else t is x and they are made here ([f0/2 | f2/2 | fR/r2 | fI/r2], group_dft's x layout;
// only when needs_p). Not-needed outputs stay as passed in.
// gf_made, g0_sums: grad_y's planes and g0's partial column sums if grad_x's kernel wrote them
// (grad_x_fused), else undefined; grad_bias then sums g0_sums.
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

// The backward ops' argument checks: grad_y (M, 4d), t (M, 4c) (x or its planes, named tname) and planes
// (4, d, c), on one CUDA device, of one dtype among float32, float16, bfloat16; `what` names the op. With
// parts > 1, grad_y is one of that many column blocks (M, 4d / parts).
void check_bwd_args(const at::Tensor& grad_y, const at::Tensor& t, const at::Tensor& planes, const char* what,
                    const char* tname, int64_t parts = 1) {
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

// The backward ops' shared body: t is x, or with kept x's planes from eq_linear_fwd_xf (then gemm).
// With gx_f32 (fp16 / bf16), grad_x is FP32 (grad_x_fused; the GEMM forms widen theirs).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& grad_y, const at::Tensor& t,
                                                   const at::Tensor& planes, bool needs_x, bool needs_p, bool needs_b,
                                                   bool gemm, bool kept, bool gx_f32) {
  const int64_t d = planes.size(1);
  const at::cuda::CUDAGuard guard(grad_y.device());
  const at::Tensor gy = grad_y.contiguous();
  at::Tensor gx, gp, gb;  // undefined until computed; or_empty for the ones not needed
  const auto out = [&]() -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
    const at::Tensor x_out = gx_f32 && needs_x ? gx.to(at::kFloat) : gx;
    return {or_empty(x_out, gy.options()), or_empty(gp, gy.options()), or_empty(gb, gy.options())};
  };
  if (!gemm && (needs_p || needs_b)) {
    // The fused weight gradient first: its reduce kernel also makes grad_x's adjoint planes (one launch less).
    at::Tensor adj;
    const at::Tensor pc = planes.contiguous();
    auto [p, b] = needs_x ? weight_grads(t, gy, &pc, &adj) : weight_grads(t, gy);
    if (needs_x) gx = grad_x_fused(gy, planes, false, gx_f32, nullptr, nullptr, adj).first;
    if (needs_p) gp = p;
    if (needs_b) gb = b;
    return out();
  }
  bool gx_gemm = false;
  at::Tensor gf, g0_sums;  // grad_y's planes, if grad_x's kernel writes them for the GEMM-form weight gradient
  if (needs_x)
    std::tie(gx, gx_gemm) = grad_x_fused(gy, planes, gemm, gx_f32, gemm && needs_p ? &gf : nullptr, &g0_sums);
  if (!needs_p && !needs_b && !gx_gemm) return out();
  if (!needs_p && !gx_gemm) {
    gb = gy.sum(0, false, at::kFloat).view({d, 4}).sum(1).to(gy.scalar_type());
    return out();
  }
  bwd_from_planes(gy, gf, g0_sums, t, kept, planes, gx_gemm, needs_p, needs_b, gx, gp, gb);
  return out();
}

// The whole backward in one op (one host call instead of a dozen Python-dispatched ones):
// grad_y (M, 4d), x (M, 4c), planes (4, d, c) -> (grad_x (M, 4c), grad_planes (4, d, c), grad_bias (d,)),
// each an empty (0,) tensor when not needed. grad_x: grad_x_fused, or for fp16 / bf16 with gemm the
// GEMM form (products_form). Weight: gemm = false: the fused kernel; gemm = true: both group DFTs into
// column blocks (grad_bias from grad_y's column sums) and three GEMMs (bwd_from_planes).
// Workspace of the GEMM form: grad_y's planes (M, 4d) and x's (M, 4c) in their dtype, and for the
// GEMM-form grad_x an (M, 4c) FP32 buffer of plane products.
// grad_x_fp32: grad_x in FP32 (fp16 / bf16 tensors: the backward of eq_linear_fwd_cast, whose input is FP32).
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd(const at::Tensor& grad_y, const at::Tensor& x,
                                                             const at::Tensor& planes, bool needs_x, bool needs_p,
                                                             bool needs_b, bool gemm, bool grad_x_fp32) {
  check_bwd_args(grad_y, x, planes, "eq_linear_bwd", "x");
  return bwd(grad_y, x, planes, needs_x, needs_p, needs_b, gemm, false, grad_x_fp32);
}

// The backward of eq_linear_fwd_xf: eq_linear_bwd's GEMM form with x's planes xf (M, 4c) = [f0 | f2 | fR
// | fI] / 2 as that op returned them, in place of x (no group DFT of x).
std::tuple<at::Tensor, at::Tensor, at::Tensor> eq_linear_bwd_xf(const at::Tensor& grad_y, const at::Tensor& xf,
                                                                const at::Tensor& planes, bool needs_x, bool needs_p,
                                                                bool needs_b) {
  check_bwd_args(grad_y, xf, planes, "eq_linear_bwd_xf", "xf");
  return bwd(grad_y, xf, planes, needs_x, needs_p, needs_b, true, true, false);
}

// ---- A layer's output in three parts (an attention's q, k, v) ----------------------------------------------
// Whether a 16-bit layer (x (M, 4k) -> (M, 4n)) goes to the Hopper kernel (as fwd routes it), which takes x
// and y in parts.
bool hopper_16bit_takes(const at::Tensor& x, int64_t M, int64_t k, int64_t n) {
  if (x.scalar_type() == at::kFloat || products_form() == ProductsForm::kGemm || !hopper_kernels_may_run(x))
    return false;
  const FwdParams p{nullptr, nullptr, nullptr, nullptr, M, k, n};
  return !eq_linear_fwd_narrow_applies(p, static_cast<int>(x.element_size()), false);
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
  if (hopper_16bit_takes(xc, M, c, d) &&
      fwd_sm90_16bit(xc, pc, b, y, at::Tensor(), 1.f, at::Tensor(), false, {}, {y1, y2}))
    return out;
  const at::Tensor full = fwd(xc, pc, b, false, what);
  y0.copy_(full.narrow(1, 0, w));
  y1.copy_(full.narrow(1, w, w));
  y2.copy_(full.narrow(1, 2 * w, w));
  return out;
}

// The backward of eq_linear_fwd_split3 with the fused weight gradient (eq_linear_bwd with gemm = false), grad_y
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
    if (hopper_16bit_takes(g0, M, d, c)) {
      if (!adj.defined()) adj = adjoint_planes(pc);
      gx = at::empty({M, 4 * c}, g0.options().dtype(f32 ? at::kFloat : g0.scalar_type()));
      done = fwd_sm90_16bit(g0, adj, at::Tensor(), gx, at::Tensor(), 1.f, at::Tensor(), false, {g1, g2});
    }
    if (!done) gx = grad_x_fused(joined(), planes, false, f32, nullptr, nullptr, adj).first;
    if (grad_x_fp32) gx = gx.to(at::kFloat);
  }
  return {or_empty(gx, g0.options()), or_empty(gp, g0.options()), or_empty(gb, g0.options())};
}

// ---- Group LayerNorm (eq_group_layer_norm.h) ----

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

}  // namespace

// Every op takes its tensors in any layout (it makes them contiguous and, where a kernel needs it, aligned,
// itself), so they are tagged flexible_layout: Inductor then hands over views of its buffers as they are.
// With its default for custom ops (the eager strides, exactly), a view of a not yet computed pointwise
// result was computed straight into a buffer of the view's shape, with indexing that Triton did not
// vectorize: the q / k / v gradient stack of a ViT's attention before qkv's backward took 1.99 ms per
// compiled ViT-B step, against 0.92 ms for plain's (the same stack, realized in its own shape and viewed
// as matmul's input; benchmarks/README.md, v21).
const std::vector<at::Tag> kAnyLayout = {at::Tag::flexible_layout};

TORCH_LIBRARY(flash_eqlinear, m) {
  m.def("eq_linear_fwd(Tensor x, Tensor planes, Tensor? bias) -> Tensor", kAnyLayout);
  m.def("eq_linear_bwd_weight(Tensor x, Tensor grad_y) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_group_dft(Tensor t, bool input, bool sum) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_linear_bwd(Tensor grad_y, Tensor x, Tensor planes, bool needs_x, bool needs_p, bool needs_b, "
        "bool gemm, bool grad_x_fp32=False) -> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("eq_linear_fwd_xf(Tensor x, Tensor planes, Tensor? bias) -> (Tensor, Tensor)", kAnyLayout);
  m.def("eq_linear_bwd_xf(Tensor grad_y, Tensor xf, Tensor planes, bool needs_x, bool needs_p, bool needs_b) "
        "-> (Tensor, Tensor, Tensor)",
        kAnyLayout);
  m.def("eq_linear_fwd_gelu(Tensor x, Tensor planes, Tensor? bias) -> Tensor", kAnyLayout);
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
}

TORCH_LIBRARY_IMPL(flash_eqlinear, CUDA, m) {
  m.impl("eq_linear_fwd", &eq_linear_fwd);
  m.impl("eq_linear_bwd_weight", &eq_linear_bwd_weight);
  m.impl("eq_group_dft", &eq_group_dft_op);
  m.impl("eq_linear_bwd", &eq_linear_bwd);
  m.impl("eq_linear_fwd_xf", &eq_linear_fwd_xf);
  m.impl("eq_linear_bwd_xf", &eq_linear_bwd_xf);
  m.impl("eq_linear_fwd_gelu", &eq_linear_fwd_gelu);
  m.impl("eq_linear_fwd_cast", &eq_linear_fwd_cast);
  m.impl("eq_linear_fwd_split3", &eq_linear_fwd_split3);
  m.impl("eq_linear_bwd_split3", &eq_linear_bwd_split3);
  m.impl("group_layer_norm_fwd", &group_layer_norm_fwd);
  m.impl("group_layer_norm_bwd", &group_layer_norm_bwd);
}

}  // namespace flash_eqlinear

// Importing flash_eqlinear._C runs the static registrations above; the module itself is empty.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
