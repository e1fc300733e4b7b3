// The weight gradient's fixed-order reduce of its row-chunk partials, as a description that a launch can
// carry: the reduce kernel's (eq_linear_bwd_weight_split.cuh), or the Hopper forward's, whose idle producer
// warps run it beside grad_x's tiles (eq_linear_fwd_sm90.cu; FwdParams::side), so that it takes no launch
// and no time of its own. Either way each output sums its partials in the same order: the same bits.
//
// Torch-free (plain C++): the bindings hold one between the two launches.
#pragma once

namespace flash_eqlinear {

struct ReduceJob {
  const float* ws = nullptr;       // [S][4][d][ldw] FP32 partials, unscaled (nullptr: no job)
  const float* ws_bias = nullptr;  // [S_bias][d] FP32 bias partials
  void* out = nullptr;             // grad_planes (4, d, c), the element type of the launch
  void* out_bias = nullptr;        // grad_bias (d,), or nullptr
  int S = 0, S_bias = 0, c = 0, d = 0, ldw = 0;
  float s_real = 1.f, s_cplx = 1.f;  // scales of planes 0, 3 and of planes 1, 2
  // Rows (g, o) with o >= o_last (the weight gradient's last o tile, split::Plan::S_last) sum only their
  // first S_last partials, and their biases the first S_bias_last.
  int o_last = 0x7fffffff, S_last = 0, S_bias_last = 0;
  bool vec_out = false;  // c % 4 == 0 and out aligned to 4 elements: one vector store per 4 channels
};

}  // namespace flash_eqlinear
