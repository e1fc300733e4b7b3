// Hopper (sm_90a) forward: fp16 / bf16 and TF32 entry points, launched where the plan
// (eq_linear_plan.h) picks them. Layouts and math: eq_linear_fwd.h.
#pragma once

#include <cuda_runtime.h>

#include "eq_linear_fwd.h"
#include "eq_switches.h"  // sm90_path_enabled (FLASH_EQLINEAR_SM90=0: the portable kernels only)

namespace flash_eqlinear {

// Launch when the device, the build, the shape and the alignments allow it (*launched = true, the
// launch error returned); otherwise launch nothing, *launched = false, cudaSuccess (unless a device
// query failed).
// With p.xf, the kernel also writes x's Fourier planes there (three idle warps of the producer
// warpgroup, from the x tiles in shared memory).
// Rows of FwdParams::xf_sums for M rows: three writer warps per 128-row tile.
constexpr int64_t eq_linear_fwd_sm90_sum_rows(int64_t M) { return (M + 127) / 128 * 3; }

cudaError_t eq_linear_fwd_sm90_fp16(const FwdParams& p, cudaStream_t stream, bool* launched);
cudaError_t eq_linear_fwd_sm90_bf16(const FwdParams& p, cudaStream_t stream, bool* launched);
// FP32 tensors on TF32 tensor cores (the caller decides that TF32 is allowed): float x / planes / bias
// / y, c % 4 == 0, bias 8-byte aligned, no p.xf; otherwise as above.
cudaError_t eq_linear_fwd_sm90_tf32(const FwdParams& p, cudaStream_t stream, bool* launched);

}  // namespace flash_eqlinear
