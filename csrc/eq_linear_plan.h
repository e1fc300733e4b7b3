// The plan of a p4 layer call on the fused kernels: every choice of path made in one place.
//
// Torch-free: sizes, an element type, the device's compute capability and the switches in, enums out.
// The host code (eq_linear_*_api.cpp, eq_linear_autograd.cpp) asks plan_layer once per call and follows
// it; flash_eqlinear.explain shows it (explain_layer). The only thing left to the launchers is to decline
// a Hopper kernel where pointer alignment or the build rules it out; the plan names the path taken then
// (fallback).
#pragma once
#include <cstdint>
#include <string>

#include "eq_elem.h"
#include "eq_linear_fwd.h"

namespace flash_eqlinear {

// The forward's kernel for x (M, 4c) -> y (M, 4d) (also grad_x's: the forward on the adjoint planes).
enum class FwdPath {
  kNarrow,      // c, d <= 32 (64 for exact FP32): one streaming pass (eq_linear_fwd_narrow.h)
  kExactFp32,   // exact FP32 SIMT tiles (eq_linear_fwd_fp32.cu)
  kSplitTf32,   // FP32 as 3xTF32 GEMMs over x's planes (opt-in: FLASH_EQLINEAR_FP32=3xtf32)
  kTf32Hopper,  // FP32 with TF32 allowed, the sm_90a wgmma kernel (fallback: kTf32Gemm)
  kTf32Gemm,    // FP32 with TF32 allowed: group DFT, cuBLAS GEMMs, inverse DFT
  kHopper16,    // fp16 / bf16, the sm_90a wgmma kernel (fallback: fallback16)
  kGemm16,      // fp16 / bf16: group DFT, cuBLAS GEMMs, inverse DFT
  kMma16,       // fp16 / bf16, the mma.sync kernel (Ampere and newer)
};

// How a training forward runs (what it keeps for the backward).
enum class TrainForm {
  kInference,    // no gradient recorded
  kPlain,        // the forward kernel, x kept
  kRoundX,       // an FP32 x under 16-bit autocast rounded in the op; grad_x comes back in FP32
  kKeepPlanes,   // x's Fourier planes kept instead of x (the weight gradient's GEMM form uses them)
  kParts,        // three outputs of their own written in place (flash_eq_linear_chunks, chunks = 3)
};

enum class WeightGrad { kNone, kFused, kGemm };
enum class GradXPath {
  kNone,
  kKernel,        // the forward's kernel on the adjoint planes (gradx_fwd)
  kHopperPlanes,  // fp16 / bf16 beside the GEMM-form weight gradient: the Hopper kernel on the adjoint
                  // planes, writing grad_y's planes for the weight gradient (fallback: kGemm)
  kGemm,          // the GEMM form from grad_y's planes (shared with the weight gradient)
};

struct LayerQuery {
  int64_t M = 0, c = 0, d = 0;  // rows, input and output fields per group copy
  Elem elem = Elem::kFloat;     // the planes' (kernels') element type
  bool x_fp32 = false;          // x is FP32 with 16-bit planes (autocast): rounded in the op
  int sm_major = 0;             // the device's compute capability
  bool tf32 = false;            // PyTorch allows TF32 in matmuls (the switch F.linear follows)
  bool needs_x = false, needs_p = false, needs_b = false;  // gradients recorded
  int chunks = 0;               // 3: flash_eq_linear_chunks' q, k, v parts; else 0
  // Optional: the tensors' addresses (the narrow mma.sync kernel needs 16-byte rows); nullptr: aligned.
  const void* x = nullptr;
  const void* y = nullptr;
};

// A forward's kernel, and the one that runs where a Hopper launcher declines the tensors (alignment,
// build); fallback == path where there is none.
struct FwdChoice {
  FwdPath path = FwdPath::kExactFp32;
  FwdPath fallback = FwdPath::kExactFp32;
};

struct LayerPlan {
  FwdPath fwd = FwdPath::kExactFp32;       // the inference forward's kernel, and the training forward's
                                           // for kPlain / kRoundX
  FwdPath fallback = FwdPath::kExactFp32;  // FwdChoice::fallback
  TrainForm train = TrainForm::kInference;
  WeightGrad wgrad = WeightGrad::kNone;
  bool wgrad_hopper = false;  // wgrad == kFused: plan_weight_grad_hopper
  GradXPath gradx = GradXPath::kNone;
  FwdPath gradx_fwd = FwdPath::kExactFp32;  // gradx == kKernel: the forward's kernel on the adjoint planes
};

// The forward's kernel for p (M, c, d and, where known, the x / y addresses). why: appended reasons.
FwdChoice plan_forward(const FwdParams& p, Elem elem, int sm_major, bool tf32, std::string* why = nullptr);
// Whether the inference forward's GEMM form takes the complex pair as three products (a sixth fewer MACs
// for one more x-sized block written and read: it pays where the GEMMs dominate).
bool plan_three_products(int64_t cd, Elem elem);
// The weight-gradient method for a layer with c, d (FLASH_EQLINEAR_DEBUG weight_grad forces one).
WeightGrad plan_weight_grad(int64_t c, int64_t d, Elem elem, int sm_major, bool tf32, std::string* why = nullptr);
// The fused weight gradient's kernel for fp16 / bf16: the Hopper one (c, d even, sm_90, Hopper kernels on), else
// mma.sync (FP32: the SIMT kernel, false).
bool plan_weight_grad_hopper(int64_t c, int64_t d, Elem elem, int sm_major);
// Whether fp16 / bf16 plane products where the GEMM form is an option (grad_x beside the GEMM-form weight
// gradient, the planes-keeping forward) go to the Hopper kernel instead (its fallback: the GEMM form).
bool hopper_takes_products(int64_t cd, int sm_major);
// Whether an FP32 x that 16-bit autocast would cast, and whose gradient is recorded, is rounded in the op
// instead (FLASH_EQLINEAR_DEBUG fused_cast=0: cast first).
bool plan_rounds_x();
// The whole call.
LayerPlan plan_layer(const LayerQuery& q, std::string* why = nullptr);
// The plan as "key=value" lines followed by "why=" lines (flash_eqlinear.explain).
std::string explain_layer(const LayerQuery& q);

const char* name(FwdPath v);
const char* name(TrainForm v);
const char* name(WeightGrad v);
const char* name(GradXPath v);

}  // namespace flash_eqlinear
