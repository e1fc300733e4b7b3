// Group LayerNorm forward and backward (T = 4): layouts and formulas in eq_group_layer_norm.h.
//
// A row's 4c values are the 4 group copies of c fields, so lane l of the row's warp holds fields l, l + 32,
// ... with their 4 copies in one vector load (16 bytes of float, 8 of a 16-bit type), and each field's
// shared weight and bias apply to the whole vector. The backward keeps a field's two parameter sums (over
// its copies and the warp's rows) in registers, then sums the block's warps in shared memory: one partial
// row per block, no atomics.

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_func_attr.cuh"
#include "eq_group_layer_norm.h"

namespace flash_eqlinear {
namespace {

constexpr int kWarps = 8;  // rows in flight per block (one per warp)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int s = 16; s > 0; s /= 2) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

// 16-bit element bits <-> FP32 (round to nearest on the way in).
template <class T> __device__ __forceinline__ float bits_to_float(uint32_t h) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  else return __uint_as_float(h << 16);
}
template <class T> __device__ __forceinline__ uint32_t float_to_bits(float v) {
  if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(__float2half_rn(v));
  else return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// The 4 group copies of one field: one 16-byte (float) or 8-byte (16-bit) access, kept as loaded (Raw4) until
// unpacked to FP32 where used.
template <class T> using Raw4 = std::conditional_t<sizeof(T) == 4, float4, uint2>;
template <class T> __device__ __forceinline__ Raw4<T> load_raw4(const T* p) {
  return *reinterpret_cast<const Raw4<T>*>(p);
}
template <class T> __device__ __forceinline__ void unpack4(const Raw4<T>& a, float (&v)[4]) {
  if constexpr (sizeof(T) == 4) {
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    v[0] = bits_to_float<T>(a.x & 0xffffu), v[1] = bits_to_float<T>(a.x >> 16);
    v[2] = bits_to_float<T>(a.y & 0xffffu), v[3] = bits_to_float<T>(a.y >> 16);
  }
}
template <class T> __device__ __forceinline__ void load4(const T* p, float (&v)[4]) { unpack4<T>(load_raw4(p), v); }

template <class T> __device__ __forceinline__ void store4(T* p, const float (&v)[4]) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(float_to_bits<T>(v[0]) | (float_to_bits<T>(v[1]) << 16),
                                              float_to_bits<T>(v[2]) | (float_to_bits<T>(v[3]) << 16));
  }
}

// Stores f(i, e) for copy e of the lane's field i (o = lane + 32 i < c) of a row.
template <int kV, class T, class F> __device__ __forceinline__ void store_row(T* row, int lane, int c, F&& f) {
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int o = lane + 32 * i;
    if (o < c) {
      float out[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) out[e] = f(i, e);
      store4(row + 4 * o, out);
    }
  }
}

// kV: fields per lane (c <= 32 kV); one row per warp.
template <class TX, class TY, int kV>
__global__ void __launch_bounds__(kWarps * 32) group_ln_fwd_kernel(const GroupLayerNormFwdParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.M) return;  // whole warps
  const int c = p.c;
  const TX* xr = static_cast<const TX*>(p.x) + row * (4 * int64_t(c));
  float v[kV][4], w[kV], b[kV];  // the parameters loaded with x, not after the reductions
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int o = lane + 32 * i;
    if (o < c) {
      load4(xr + 4 * o, v[i]);
      w[i] = p.weight[o];
      b[i] = p.bias[o];
      s += (v[i][0] + v[i][1]) + (v[i][2] + v[i][3]);
    } else {
      v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.f;
    }
  }
  const float inv_n = 1.f / float(4 * c);
  const float mean = warp_sum(s) * inv_n;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    if (lane + 32 * i < c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[i][e] -= mean;
        q = fmaf(v[i][e], v[i][e], q);
      }
    }
  }
  const float rstd = rsqrtf(warp_sum(q) * inv_n + p.eps);
  store_row<kV>(static_cast<TY*>(p.y) + row * (4 * int64_t(c)), lane, c,
                [&](int i, int e) { return fmaf(v[i][e] * rstd, w[i], b[i]); });
  if (lane == 0) {
    p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
}

// The backward's resident blocks per SM, as compiled for: its registers are mostly the row's values as loaded
// (Raw4: a row is read once, each value unpacked again where used) and three per field (weight, its two sums),
// plus about 22. The row's loads are the bytes in flight, so the more warps the faster: ViT-B's c = 192 in
// 16-bit fits four blocks (32 warps) where FP32 copies of the row held two.
template <class TX, class TY, int kV> constexpr int bwd_min_blocks() {
  constexpr int regs = kV * (int(sizeof(Raw4<TX>) + sizeof(Raw4<TY>)) / 4 + 3) + 22;
  constexpr int b = 65536 / (kWarps * 32 * regs);
  return b < 1 ? 1 : b > 4 ? 4 : b;
}

// Rows row0, row0 + stride, ... per warp (row0 = block * kWarps + warp, stride = grid * kWarps).
template <class TX, class TY, int kV>
__global__ void __launch_bounds__(kWarps * 32, (bwd_min_blocks<TX, TY, kV>()))
    group_ln_bwd_kernel(const GroupLayerNormBwdParams p) {
  __shared__ float red[2][kWarps][32 * kV];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = p.c;
  const int64_t n = 4 * int64_t(c);
  const float inv_n = 1.f / float(n);
  float w[kV], dw[kV], db[kV];
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int o = lane + 32 * i;
    w[i] = o < c ? p.weight[o] : 0.f;
    dw[i] = db[i] = 0.f;
  }
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < p.M; row += stride) {
    const float mean = p.mean[row], rstd = p.rstd[row];
    const TY* gr = static_cast<const TY*>(p.grad_y) + row * n;
    const TX* xr = static_cast<const TX*>(p.x) + row * n;
    Raw4<TY> graw[kV];
    Raw4<TX> xraw[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      const int o = lane + 32 * i;
      if (o < c) {
        graw[i] = load_raw4(gr + 4 * o);
        xraw[i] = load_raw4(xr + 4 * o);
      }
    }
    // Field i's grad_y copies, and its x copies normalised (xhat).
    const auto unpack = [&](int i, float (&g)[4], float (&xh)[4]) {
      unpack4<TY>(graw[i], g);
      unpack4<TX>(xraw[i], xh);
#pragma unroll
      for (int e = 0; e < 4; ++e) xh[e] = (xh[e] - mean) * rstd;
    };
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      if (lane + 32 * i < c) {
        float g[4], xh[4];
        unpack(i, g, xh);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float gw = g[e] * w[i];
          s1 += gw;
          s2 = fmaf(gw, xh[e], s2);
          dw[i] = fmaf(g[e], xh[e], dw[i]);
          db[i] += g[e];
        }
      }
    }
    if (p.grad_x != nullptr) {  // uniform over the grid
      s1 = warp_sum(s1) * inv_n;
      s2 = warp_sum(s2) * inv_n;
      store_row<kV>(static_cast<TX*>(p.grad_x) + row * n, lane, c, [&](int i, int e) {
        float g[4], xh[4];
        unpack(i, g, xh);
        return rstd * (__fmul_rn(g[e], w[i]) - s1 - xh[e] * s2);  // g w rounded, as in the sums (no FMA)
      });
    }
  }
  if (p.partials == nullptr) return;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    red[0][warp][lane + 32 * i] = dw[i];
    red[1][warp][lane + 32 * i] = db[i];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < c; o += kWarps * 32) {
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      a += red[0][k][o];
      b += red[1][k][o];
    }
    p.partials[int64_t(blockIdx.x) * c + o] = a;
    p.partials[(int64_t(gridDim.x) + blockIdx.x) * c + o] = b;
  }
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0; }
int elem_bytes(ElemType t) { return t == ElemType::kFloat ? 4 : 2; }

// Calls f(TX{}, TY{}) for the supported pairs: equal types, or an FP32 x with any y.
template <class F> cudaError_t with_types(ElemType xt, ElemType yt, F&& f) {
  if (xt != yt && xt != ElemType::kFloat) return cudaErrorInvalidValue;
  auto with_y = [&](auto tx) -> cudaError_t {
    if constexpr (!std::is_same_v<decltype(tx), float>) {
      return f(tx, tx);  // yt == xt (above)
    } else {
      switch (yt) {
        case ElemType::kFloat: return f(tx, float{});
        case ElemType::kHalf: return f(tx, __half{});
        case ElemType::kBFloat16: return f(tx, __nv_bfloat16{});
      }
      return cudaErrorInvalidValue;
    }
  };
  switch (xt) {
    case ElemType::kFloat: return with_y(float{});
    case ElemType::kHalf: return with_y(__half{});
    case ElemType::kBFloat16: return with_y(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(std::integral_constant<int, kV>{}) with the fewest fields per lane that hold c.
template <class F> cudaError_t with_fields_per_lane(int c, F&& f) {
  if (c <= 32) return f(std::integral_constant<int, 1>{});
  if (c <= 64) return f(std::integral_constant<int, 2>{});
  if (c <= 128) return f(std::integral_constant<int, 4>{});
  if (c <= 192) return f(std::integral_constant<int, 6>{});
  if (c <= 256) return f(std::integral_constant<int, 8>{});
  if (c <= 384) return f(std::integral_constant<int, 12>{});
  static_assert(kGroupLayerNormMaxFields == 16 * 32, "the largest variant");
  return f(std::integral_constant<int, 16>{});
}

}  // namespace

cudaError_t eq_group_layer_norm_fwd(const GroupLayerNormFwdParams& p, ElemType x_type, ElemType y_type,
                                    cudaStream_t stream) {
  if (p.M < 0 || p.c < 1 || p.c > kGroupLayerNormMaxFields || !(p.eps >= 0.f)) return cudaErrorInvalidValue;
  if (p.M == 0) return cudaSuccess;
  if (!aligned(p.x, 4 * elem_bytes(x_type)) || !aligned(p.y, 4 * elem_bytes(y_type)) || p.weight == nullptr ||
      p.bias == nullptr || p.mean == nullptr || p.rstd == nullptr)
    return cudaErrorInvalidValue;
  const int64_t blocks = (p.M + kWarps - 1) / kWarps;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  return with_types(x_type, y_type, [&](auto tx, auto ty) {
    return with_fields_per_lane(p.c, [&](auto v) {
      group_ln_fwd_kernel<decltype(tx), decltype(ty), decltype(v)::value>
          <<<unsigned(blocks), kWarps * 32, 0, stream>>>(p);
      return cudaGetLastError();
    });
  });
}

int eq_group_layer_norm_bwd_blocks(int64_t M, int c, ElemType x_type, ElemType y_type, int sm_count) {
  // As many blocks as fit at once (each walks its rows), fewer for few rows.
  int per_sm = 1;
  if (c >= 1 && c <= kGroupLayerNormMaxFields)
    (void)with_types(x_type, y_type, [&](auto tx, auto ty) {
      return with_fields_per_lane(c, [&](auto v) {
        per_sm = resident_blocks_per_sm(group_ln_bwd_kernel<decltype(tx), decltype(ty), decltype(v)::value>,
                                        kWarps * 32, 0);
        return cudaSuccess;
      });
    });
  const int64_t by_rows = (M + kWarps - 1) / kWarps;
  const int64_t b = by_rows < int64_t(per_sm) * sm_count ? by_rows : int64_t(per_sm) * sm_count;
  return b < 1 ? 1 : int(b);
}

cudaError_t eq_group_layer_norm_bwd(const GroupLayerNormBwdParams& p, ElemType x_type, ElemType y_type,
                                    cudaStream_t stream) {
  if (p.M < 0 || p.c < 1 || p.c > kGroupLayerNormMaxFields || p.blocks < 1) return cudaErrorInvalidValue;
  if (p.grad_x == nullptr && p.partials == nullptr) return cudaSuccess;
  if (!aligned(p.grad_y, 4 * elem_bytes(y_type)) || !aligned(p.x, 4 * elem_bytes(x_type)) ||
      (p.grad_x != nullptr && !aligned(p.grad_x, 4 * elem_bytes(x_type))) || p.weight == nullptr ||
      p.mean == nullptr || p.rstd == nullptr)
    return cudaErrorInvalidValue;
  return with_types(x_type, y_type, [&](auto tx, auto ty) {
    return with_fields_per_lane(p.c, [&](auto v) {
      group_ln_bwd_kernel<decltype(tx), decltype(ty), decltype(v)::value><<<p.blocks, kWarps * 32, 0, stream>>>(p);
      return cudaGetLastError();
    });
  });
}

}  // namespace flash_eqlinear
