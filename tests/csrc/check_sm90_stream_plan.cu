// Host-only check of the Hopper weight gradient's stream-K plan (eq_linear_bwd_weight_sm90.h): walks
// every CTA's share piece by piece as the kernel does and checks that each (tile, k tile) is covered
// exactly once, that slab indices count a tile's pieces in order, and that the classes end together.
// Prints "ok" or the first failure; run by tests/test_bwd_weight_plan.py.
#include <cmath>
#include <cstdio>
#include <vector>

#include "eq_linear_bwd_weight_sm90.h"

using flash_eqlinear::Sm90Piece;
using flash_eqlinear::Sm90StreamPlan;

static int check(int64_t M, int64_t c, int64_t d, int sms) {
  const Sm90StreamPlan s = flash_eqlinear::make_sm90_stream_plan(M, c, d, sms);
  const int num_o = int((d + 127) / 128);
  const int ctas = s.ctas_full + s.ctas_tail;
  auto fail = [&](const char* what) {
    std::printf("FAIL M=%lld c=%lld d=%lld sms=%d: %s\n", (long long)M, (long long)c, (long long)d, sms, what);
    return 1;
  };
  if (ctas < 1 || ctas > (sms < 2 ? 2 : sms)) return fail("CTA count");
  if ((s.tail == 1) != (d % 128 != 0 && d % 128 <= 64) || s.num_of + s.tail != num_o) return fail("classes");
  // covered[o tile][c tile][kt]; pieces seen per tile, in order; the bias partials [j][c tile][o tile]
  // the pieces write (1), the others NaN
  std::vector<int> covered(size_t(num_o) * s.num_c * s.kt, 0), seen(size_t(num_o) * s.num_c, 0);
  const int d_pad = num_o * 128;  // bias partials of o = 128 o tile stand for the tile
  std::vector<float> bias(size_t(s.max_pieces) * s.num_c * d_pad, std::nanf(""));
  double longest[2] = {0, 0};
  for (int cls = 0; cls < 2; ++cls) {
    if (s.ctas(cls) > 0 && s.units(cls) < s.ctas(cls)) return fail("more CTAs than units");
    for (int b = 0; b < s.ctas(cls); ++b) {
      const int64_t begin = s.share_begin(cls, b), end = s.share_begin(cls, b + 1);
      if (end <= begin) return fail("empty share");
      for (int64_t u = begin; u < end;) {
        const Sm90Piece pc = s.piece_at(cls, b, end, u);
        if (pc.kt0 < 0 || pc.kt1 <= pc.kt0 || pc.kt1 > s.kt) return fail("piece range");
        if ((pc.o_tile == s.num_of) != (cls == 1) || pc.o_tile >= num_o || pc.c_tile >= s.num_c) return fail("tile");
        const size_t tile = size_t(pc.o_tile) * s.num_c + pc.c_tile;
        if (pc.j != seen[tile]++ || pc.j >= s.max_pieces) return fail("slab index");
        for (int kt = pc.kt0; kt < pc.kt1; ++kt) covered[tile * s.kt + kt] += 1;
        bias[(size_t(pc.j) * s.num_c + pc.c_tile) * d_pad + size_t(pc.o_tile) * 128] = 1.f;
        u += pc.kt1 - pc.kt0;
      }
      const double cost = double(end - begin) * (cls ? flash_eqlinear::kBwdWeightSm90TailCost : 1.0);
      if (cost > longest[cls]) longest[cls] = cost;
    }
  }
  for (int v : covered)
    if (v != 1) return fail("coverage");
  for (int ot = 0; ot < num_o; ++ot)
    for (int ct = 0; ct < s.num_c; ++ct) {
      const int n = seen[size_t(ot) * s.num_c + ct];
      if (n != s.pieces_at(ot, ct) || n != s.slabs(ot * 128 + 1, ct * 64)) return fail("piece count");
    }
  // grad_bias: every partial its tile's pieces wrote, once, and nothing else
  for (int ot = 0; ot < num_o; ++ot) {
    int n = 0;
    for (int ct = 0; ct < s.num_c; ++ct) n += seen[size_t(ot) * s.num_c + ct];
    if (s.bias_sum(bias.data(), ot * 128, d_pad) != float(n)) return fail("bias partials");
  }
  // Balance, where the CTAs are many enough for the split between the classes to be fine-grained: the
  // longest share within 10% of the ideal (the whole cost spread evenly over the CTAs).
  const int64_t total = s.units(0) + s.units(1);
  if (ctas == sms && sms >= 100 && total >= 64 * sms) {
    const double ideal = (double(s.units(0)) + flash_eqlinear::kBwdWeightSm90TailCost * double(s.units(1))) / ctas;
    if (std::max(longest[0], longest[1]) > 1.1 * ideal + 2) return fail("balance");
  }
  return 0;
}

int main() {
  const int64_t Ms[] = {1, 31, 32, 33, 257, 700, 4097, 25216, 32768, 100003};
  const int64_t sizes[] = {2, 16, 48, 64, 66, 128, 130, 192, 200, 256, 258, 576, 768, 1024, 1026, 2048};
  const int sms[] = {1, 2, 7, 108, 132};
  int bad = 0;
  for (int64_t M : Ms)
    for (int64_t c : sizes)
      for (int64_t d : sizes)
        for (int n : sms) bad += check(M, c, d, n);
  if (bad == 0) std::printf("ok\n");
  return bad != 0;
}
