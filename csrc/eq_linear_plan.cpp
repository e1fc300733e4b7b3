// The plan of a layer call (eq_linear_plan.h). The size thresholds were set by measurements, listed in
// docs/performance.md ("Where each path runs").
#include "eq_linear_plan.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "eq_linear_fwd_narrow.h"
#include "eq_switches.h"

namespace flash_eqlinear {
namespace {

// FP32 as 3xTF32 (opt-in) from this many weights per plane (c * d); below it the exact kernel is faster.
constexpr int64_t kSplitMinCD = int64_t(1) << 18;
// FP32 with TF32 allowed: the Hopper kernel below this c * d, the DFT + cuBLAS form from it on.
constexpr int64_t kFusedTf32MaxCD = int64_t(1) << 19;
// fp16 / bf16: the GEMM form (or, on Hopper GPUs, the Hopper kernel) from this c * d on.
constexpr int64_t kGemmFwdMinCD = int64_t(1) << 18;
// The inference forward's GEMM form: the complex pair as three products from this c * d on.
constexpr int64_t kThreeProductsMinCDTf32 = int64_t(1) << 20;
constexpr int64_t kThreeProductsMinCD16 = int64_t(1) << 22;
// fp16 / bf16 plane products where the GEMM form is an option: the Hopper kernel below this c * d.
constexpr int64_t kGemmProductsMinCD = int64_t(1) << 22;
// The weight gradient's GEMM form from this c * d on: exact FP32; fp16 / bf16 (and FP32 with TF32)
// with the mma.sync kernel; fp16 / bf16 with the Hopper kernel (c, d even).
constexpr int64_t kGemmWgradMinCDFp32 = int64_t(768) * 768;
constexpr int64_t kGemmWgradMinCD16 = int64_t(1) << 17;
constexpr int64_t kGemmWgradMinCDSm90 = int64_t(1) << 18;
// At kGemmWgradMinCDSm90 itself, layers this narrow (e.g. ViT-L's fc, 256 x 1024) keep the fused kernel.
constexpr int64_t kFusedWgradNarrowSide = 256;
// FP32 with TF32: training forwards keep x's planes from this c * d on (the DFT + cuBLAS forward makes
// them); where the TF32 Hopper kernel runs the forward, only from kFusedTf32MaxCD on.
constexpr int64_t kKeepPlanesMinCDTf32 = int64_t(1) << 17;

bool hopper(int sm_major) { return sm90_path_enabled() && sm_major == 9; }

enum class Products { kAuto, kFused, kGemm };
Products products() {
  const char* v = debug_switch("products");
  if (v == nullptr || std::strcmp(v, "auto") == 0) return Products::kAuto;
  if (std::strcmp(v, "fused") == 0) return Products::kFused;
  if (std::strcmp(v, "gemm") == 0) return Products::kGemm;
  throw std::invalid_argument(std::string("FLASH_EQLINEAR_DEBUG products must be auto, fused or gemm, got '") + v +
                              "'");
}

void note(std::string* why, const std::string& s) {
  if (why != nullptr) *why += s + "\n";
}

std::string cd_str(int64_t c, int64_t d) {
  return "c * d = " + std::to_string(c) + " * " + std::to_string(d) + " = " + std::to_string(c * d);
}

}  // namespace

const char* name(FwdPath v) {
  switch (v) {
    case FwdPath::kNarrow: return "narrow";
    case FwdPath::kExactFp32: return "exact_fp32";
    case FwdPath::kSplitTf32: return "split_tf32";
    case FwdPath::kTf32Hopper: return "tf32_hopper";
    case FwdPath::kTf32Gemm: return "tf32_gemm";
    case FwdPath::kHopper16: return "hopper";
    case FwdPath::kGemm16: return "gemm";
    case FwdPath::kMma16: return "mma";
  }
  return "?";
}

const char* name(TrainForm v) {
  switch (v) {
    case TrainForm::kInference: return "inference";
    case TrainForm::kPlain: return "plain";
    case TrainForm::kRoundX: return "round_x";
    case TrainForm::kKeepPlanes: return "keep_planes";
    case TrainForm::kParts: return "parts";
  }
  return "?";
}

const char* name(WeightGrad v) {
  switch (v) {
    case WeightGrad::kNone: return "none";
    case WeightGrad::kFused: return "fused";
    case WeightGrad::kGemm: return "gemm";
  }
  return "?";
}

const char* name(GradXPath v) {
  switch (v) {
    case GradXPath::kNone: return "none";
    case GradXPath::kKernel: return "kernel";
    case GradXPath::kHopperPlanes: return "hopper_planes";
    case GradXPath::kGemm: return "gemm";
  }
  return "?";
}

FwdChoice plan_forward(const FwdParams& p, Elem elem, int sm_major, bool tf32, std::string* why) {
  const int64_t c = p.c, d = p.d, cd = c * d;
  const bool f32 = elem == Elem::kFloat, sm90 = hopper(sm_major);
  if (eq_linear_fwd_narrow_applies(p, f32 ? 4 : 2, f32 && tf32)) {
    note(why, "forward: narrow kernel (c = " + std::to_string(c) + ", d = " + std::to_string(d) + ")");
    return {FwdPath::kNarrow, FwdPath::kNarrow};
  }
  if (f32) {
    if (cd >= kSplitMinCD && fp32_split_tf32()) {
      note(why, "forward: 3xTF32 (FLASH_EQLINEAR_FP32=3xtf32, " + cd_str(c, d) + " >= 2^18)");
      return {FwdPath::kSplitTf32, FwdPath::kSplitTf32};
    }
    if (tf32) {
      if (cd < kFusedTf32MaxCD && sm90) {
        note(why, "forward: TF32 Hopper kernel (TF32 allowed, " + cd_str(c, d) + " < 2^19)");
        return {FwdPath::kTf32Hopper, FwdPath::kTf32Gemm};
      }
      note(why, "forward: TF32 GEMM form (TF32 allowed, " + cd_str(c, d) + (sm90 ? " >= 2^19)" : ", no Hopper kernel)"));
      return {FwdPath::kTf32Gemm, FwdPath::kTf32Gemm};
    }
    note(why, "forward: exact FP32 kernel (TF32 not allowed)");
    return {FwdPath::kExactFp32, FwdPath::kExactFp32};
  }
  const Products form = products();
  const bool gemm_size = form == Products::kGemm || (form == Products::kAuto && cd >= kGemmFwdMinCD);
  if (gemm_size) {
    if (form == Products::kAuto && sm90) {
      note(why, "forward: Hopper kernel (" + cd_str(c, d) + " >= 2^18; the GEMM form where it declines)");
      return {FwdPath::kHopper16, FwdPath::kGemm16};
    }
    note(why, "forward: GEMM form (" + (form == Products::kGemm ? std::string("products=gemm") : cd_str(c, d) + " >= 2^18") + ")");
    return {FwdPath::kGemm16, FwdPath::kGemm16};
  }
  if (sm90) {
    note(why, "forward: Hopper kernel (the mma.sync kernel where it declines)");
    return {FwdPath::kHopper16, FwdPath::kMma16};
  }
  note(why, "forward: mma.sync kernel (no Hopper kernel)");
  return {FwdPath::kMma16, FwdPath::kMma16};
}

WeightGrad plan_weight_grad(int64_t c, int64_t d, Elem elem, int sm_major, bool tf32, std::string* why) {
  if (const char* v = debug_switch("weight_grad"); v != nullptr && std::strcmp(v, "auto") != 0) {
    if (std::strcmp(v, "fused") != 0 && std::strcmp(v, "gemm") != 0)
      throw std::invalid_argument(std::string("FLASH_EQLINEAR_DEBUG weight_grad must be auto, fused or gemm, got '") +
                                  v + "'");
    note(why, std::string("weight gradient: ") + v + " (FLASH_EQLINEAR_DEBUG)");
    return std::strcmp(v, "gemm") == 0 ? WeightGrad::kGemm : WeightGrad::kFused;
  }
  const int64_t cd = c * d;
  int64_t min_cd = (elem != Elem::kFloat || tf32) ? kGemmWgradMinCD16 : kGemmWgradMinCDFp32;
  if (elem != Elem::kFloat && c % 2 == 0 && d % 2 == 0 && hopper(sm_major)) {
    min_cd = kGemmWgradMinCDSm90;
    if (cd == min_cd && std::min(c, d) <= kFusedWgradNarrowSide) {
      note(why, "weight gradient: fused kernel (" + cd_str(c, d) + " = 2^18 with a side <= 256)");
      return WeightGrad::kFused;
    }
  }
  const bool gemm = cd >= min_cd;
  note(why, std::string("weight gradient: ") + (gemm ? "GEMM form (" : "fused kernel (") + cd_str(c, d) +
                (gemm ? " >= " : " < ") + std::to_string(min_cd) + ")");
  return gemm ? WeightGrad::kGemm : WeightGrad::kFused;
}

bool plan_weight_grad_hopper(int64_t c, int64_t d, Elem elem, int sm_major) {
  return elem != Elem::kFloat && c % 2 == 0 && d % 2 == 0 && hopper(sm_major);
}

bool plan_three_products(int64_t cd, Elem elem) {
  return cd >= (elem == Elem::kFloat ? kThreeProductsMinCDTf32 : kThreeProductsMinCD16);
}

bool hopper_takes_products(int64_t cd, int sm_major) {
  return products() == Products::kAuto && cd < kGemmProductsMinCD && hopper(sm_major);
}

bool plan_rounds_x() { return !debug_is("fused_cast", "0"); }

namespace {

// Whether a training forward keeps x's planes (the weight gradient takes the GEMM form, which uses them, and
// the forward makes them anyway or nearly so).
bool keeps_planes(const LayerQuery& q, WeightGrad wgrad, std::string* why) {
  if (debug_is("keep_planes", "0") || wgrad != WeightGrad::kGemm) return false;
  const int64_t c = q.c, d = q.d, cd = c * d;
  const bool sm90 = hopper(q.sm_major);
  if (q.elem == Elem::kFloat) {
    if (!q.tf32 || fp32_split_tf32()) return false;
    const bool fused_fwd = sm90 && c % 4 == 0 && d % 2 == 0;
    const bool keep = cd >= kKeepPlanesMinCDTf32 && (!fused_fwd || cd >= kFusedTf32MaxCD);
    if (keep) note(why, "training forward keeps x's planes (TF32 GEMM form makes them)");
    return keep;
  }
  if (std::max(c, d) <= kNarrowMaxC && !debug_is("narrow", "0")) return false;
  const Products form = products();
  if (form != Products::kAuto) return form == Products::kGemm;
  const bool keep = (sm90 && c % 8 == 0 && d % 2 == 0) || cd >= kGemmFwdMinCD;
  if (keep)
    note(why, std::string("training forward keeps x's planes (") +
                  (sm90 ? "the Hopper kernel writes them)" : "the GEMM form makes them)"));
  return keep;
}

}  // namespace

LayerPlan plan_layer(const LayerQuery& q, std::string* why) {
  LayerPlan plan;
  FwdParams p{q.x, nullptr, nullptr, const_cast<void*>(q.y), q.M, q.c, q.d};
  const FwdChoice fwd = plan_forward(p, q.elem, q.sm_major, q.tf32, why);
  plan.fwd = fwd.path;
  plan.fallback = fwd.fallback;
  const bool grads = q.needs_x || q.needs_p || q.needs_b;
  if (!grads) return plan;
  // The method also decides grad_x's path and what the training forward keeps where the weight needs no
  // gradient of its own.
  const WeightGrad method =
      plan_weight_grad(q.c, q.d, q.elem, q.sm_major, q.tf32, (q.needs_p || q.needs_b) ? why : nullptr);
  plan.wgrad = (q.needs_p || q.needs_b) ? method : WeightGrad::kNone;
  plan.wgrad_hopper = plan.wgrad == WeightGrad::kFused && plan_weight_grad_hopper(q.c, q.d, q.elem, q.sm_major);
  const Products form = products();
  const bool keep = q.needs_p && keeps_planes(q, method, why);
  const bool parts = q.chunks == 3 && !keep && q.elem != Elem::kFloat && q.d % 192 == 0 && q.c % 8 == 0 &&
                     hopper(q.sm_major) && form != Products::kGemm && method == WeightGrad::kFused;
  if (keep) {
    plan.train = TrainForm::kKeepPlanes;
  } else if (parts) {
    plan.train = TrainForm::kParts;
    note(why, "training forward writes the three parts in place (Hopper kernel, d % 192 == 0)");
  } else if (q.x_fp32) {
    plan.train = TrainForm::kRoundX;
    note(why, "training forward rounds the FP32 x in the op; grad_x comes back in FP32");
  } else {
    plan.train = TrainForm::kPlain;
  }
  if (q.needs_x) {
    // grad_x: the forward's kernels on the adjoint planes (c and d swapped); for fp16 / bf16 beside the
    // GEMM-form weight gradient, the GEMM form from grad_y's planes unless the Hopper kernel takes it.
    const bool gemm_wgrad = method == WeightGrad::kGemm;
    const bool may_gemm = gemm_wgrad && q.elem != Elem::kFloat && form != Products::kFused;
    if (may_gemm && !hopper_takes_products(q.c * q.d, q.sm_major)) {
      plan.gradx = GradXPath::kGemm;
      note(why, "grad_x: GEMM form from grad_y's planes (shared with the weight gradient)");
    } else if (may_gemm) {
      plan.gradx = GradXPath::kHopperPlanes;
      plan.gradx_fwd = FwdPath::kHopper16;
      note(why, "grad_x: Hopper kernel on the adjoint planes, writing grad_y's planes for the weight gradient");
    } else {
      plan.gradx = GradXPath::kKernel;
      FwdParams pa{nullptr, nullptr, nullptr, nullptr, q.M, q.d, q.c};
      std::string sub;
      plan.gradx_fwd = plan_forward(pa, q.elem, q.sm_major, q.tf32, why ? &sub : nullptr).path;
      if (why != nullptr) *why += "grad_x (adjoint planes) " + sub;
    }
  }
  return plan;
}

std::string explain_layer(const LayerQuery& q) {
  std::string why;
  const LayerPlan p = plan_layer(q, &why);
  std::string s = std::string("forward=") + name(p.fwd) + "\nfallback=" + name(p.fallback) + "\ntrain=" +
                  name(p.train) + "\nweight_grad=" + name(p.wgrad) + "\ngrad_x=" + name(p.gradx);
  if (p.wgrad == WeightGrad::kFused)
    s += std::string("\nweight_grad_kernel=") + (q.elem == Elem::kFloat ? "fp32" : p.wgrad_hopper ? "hopper" : "mma");
  if (p.gradx == GradXPath::kKernel) s += std::string("\ngrad_x_kernel=") + name(p.gradx_fwd);
  return s + "\n" + why;
}

}  // namespace flash_eqlinear
