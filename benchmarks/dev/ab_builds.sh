#!/usr/bin/env bash
# A/B of a source change that no runtime switch selects: builds the variant file, the checked-out file and
# the variant again, in that order on one machine, times the fused weight gradient after each build
# (bench_weight_grad.py --fused-only), and puts the checked-out file back. On a CUDA machine, from the
# repository root:
#   bash benchmarks/dev/ab_builds.sh csrc/eq_linear_bwd_weight_sm90.cu /path/to/variant.cu [bench_weight_grad args]
# e.g. --shapes vitB-qkv,vitB-fc1,c512 --dtypes bf16. Prints: shape, then us per call for the variant, the
# checked-out file and the variant again (the two variant columns show the drift between builds).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,8p "$0"; exit 2; }
target=$1 variant=$2
shift 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
orig=$(mktemp)
cp "$target" "$orig"
trap 'cp "$orig" "$target"' EXIT
for v in variant1 checked_out variant2; do
  if [ "$v" = checked_out ]; then cp "$orig" "$target"; else cp "$variant" "$target"; fi
  bash benchmarks/gpu_run.sh build | tail -1
  python3 benchmarks/bench_weight_grad.py --fused-only "$@" | grep " us$" > "$OUT/ab_builds_$v.log"
done
echo "dtype shape | variant | checked out | variant"
paste "$OUT/ab_builds_variant1.log" <(awk '{print $3}' "$OUT/ab_builds_checked_out.log") \
  <(awk '{print $3}' "$OUT/ab_builds_variant2.log")
