// The kernels' element types (float, __half, __nv_bfloat16), shared by the plan and the launchers.
// Torch-free: the kernel sources use it too (eq_host_common.h maps a torch dtype to it: elem_of).
#pragma once

namespace flash_eqlinear {

enum class Elem { kFloat, kHalf, kBFloat16 };

}  // namespace flash_eqlinear
