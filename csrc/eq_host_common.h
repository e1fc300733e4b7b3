// Helpers shared by the host files (eq_linear_*_api.cpp, eq_linear_host.cpp, eq_group_layer_norm_api.cpp):
// message formatting, device and dtype checks, the kernels' element type, output placeholders.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "eq_linear_plan.h"

namespace flash_eqlinear {

// Error messages are built from std::string pieces only: some toolchains link a private static
// libstdc++ into the extension whose iostream number formatting crashes (uninitialised locale),
// so integers and shapes are formatted with std::to_string instead of being streamed.
inline std::string num(int64_t v) { return std::to_string(v); }

inline std::string shape(at::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 ? ",)" : ")");
}

inline void check_device_supported(const at::Tensor& t) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(t.get_device());
  TORCH_CHECK(prop->major >= 8,
              "flash_eqlinear kernels need compute capability >= 8.0 (Ampere or newer); device ",
              num(t.get_device()), " (", prop->name, ") is sm_", num(prop->major), num(prop->minor),
              ". Set FLASH_EQLINEAR_BACKEND=reference to use the pure-PyTorch path.");
}

// The element types of the kernels.
inline bool kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// t, or where it was not computed (an output not needed) an empty (0,) tensor with options o: made only where
// needed, as allocations cost host time per call.
inline at::Tensor or_empty(const at::Tensor& t, const at::TensorOptions& o) { return t.defined() ? t : at::empty({0}, o); }

// x itself when 16-byte aligned (the group DFT kernels read float4 rows), else an aligned copy.
inline at::Tensor aligned16(const at::Tensor& x) {
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 ? x : x.clone();
}

// The kernels' element type of a kernel dtype (kernel_dtype).
inline Elem elem_of(at::ScalarType t) {
  return t == at::kFloat ? Elem::kFloat : t == at::kHalf ? Elem::kHalf : Elem::kBFloat16;
}

// The compute capability's major number of t's device (cached by PyTorch per device).
inline int sm_major_of(const at::Tensor& t) { return at::cuda::getDeviceProperties(t.get_device())->major; }

// Whether PyTorch allows TF32 in matmuls (the switch F.linear follows).
inline bool tf32_allowed() { return at::globalContext().allowTF32CuBLAS(); }

}  // namespace flash_eqlinear
