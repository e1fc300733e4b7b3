// The library's switches, in one place (README, "Switches").
//
// Three are meant for users and have variables of their own: FLASH_EQLINEAR_BACKEND (read in Python),
// FLASH_EQLINEAR_SM90 (the Hopper kernels on or off) and FLASH_EQLINEAR_FP32 (exact or 3xtf32). The
// knobs that exist to A/B kernels and paths share one variable, FLASH_EQLINEAR_DEBUG="name=value,...";
// its names are kDebugSwitches. All are read when a call needs them (a test may set them in between).
// Torch-free: the kernel sources use it too.
#pragma once

namespace flash_eqlinear {

// The names FLASH_EQLINEAR_DEBUG takes, with what each does (README).
inline constexpr const char* kDebugSwitches[] = {
    "narrow",        // 0: never the narrow kernel; 1: whenever its sizes allow
    "products",      // fused | gemm: how 16-bit plane products run where both forms apply
    "weight_grad",   // fused | gemm | reference: the weight gradient's method
    "keep_planes",   // 0: training forwards keep x, never its Fourier planes
    "fused_cast",    // 0: an FP32 x under 16-bit autocast is cast before the layer, not in it
    "fused_mlp",     // 0: flash_eq_mlp runs three calls in inference too
    "fused_norm",    // 0: GroupLayerNorm runs stock ops on CUDA
    "workspace_mb",  // the GEMM forms' workspace cap in MB (default 2048)
    "fp32_tile",     // an exact-FP32 tile index (eq_linear_fwd_fp32.cu)
    "sm90_cluster",  // 1 | 2: the Hopper forward's cluster size
    "wgrad_swap",    // 0 | 1: the Hopper weight gradient's operand order
    "wgrad_half_r",  // the mma.sync weight gradient's row split
    "pdl",           // 0 | 1: programmatic dependent launch
    "gemm_t_train",  // 1: training calls of group sizes 2 and 8 take the GEMM form too (ops.gemm_form_t)
};

// The value of FLASH_EQLINEAR_DEBUG's `name` (one of kDebugSwitches), or nullptr where it is not set.
// Throws std::invalid_argument for a malformed variable or a name not in kDebugSwitches.
const char* debug_switch(const char* name);
// Whether debug_switch(name) is set to `value`.
bool debug_is(const char* name, const char* value);
// FLASH_EQLINEAR_SM90 is not "0": the Hopper kernels may run.
bool sm90_path_enabled();
// FLASH_EQLINEAR_FP32 is "3xtf32": large FP32 layers as split-TF32 GEMMs.
bool fp32_split_tf32();

}  // namespace flash_eqlinear
