#!/usr/bin/env bash
# Build, GPU tests, compute-sanitizer, benchmarks on a CUDA machine; full logs under $OUT
# (default /tmp/out), a short summary last.
# Usage: bash benchmarks/gpu_run.sh [build] [base] [test] [sanitize] [bench] [host-ab] [bench-bwd] [bench-train] [bench-3xtf32] [bench-wgrad] [profile-bwd] [profile-net] [net] [net-train] [net-train-cast] [bench-quick] [host] [narrow] [fp32-tiles]
# (default: build test sanitize bench)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-build test sanitize bench}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
# On a GPU machine, GPU test modules fail instead of skipping when the kernels are not built.
export FLASH_EQLINEAR_REQUIRE_KERNELS=1
summary=()
# The result files this call writes (stable names, the commit inside each JSON): those newer than the stamp.
stamp=$(mktemp); trap 'rm -f "$stamp"' EXIT
has() { [[ " $stages " == *" $1 "* ]]; }

python3 -c "import sys, setuptools, torch; print(sys.executable, setuptools.__version__, torch.__version__)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
if has build; then
  t0=$SECONDS
  FLASH_EQLINEAR_FORCE_CUDA_BUILD=1 python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
  rc=$?; summary+=("build rc=$rc ($((SECONDS - t0)) s)")
  [ $rc -ne 0 ] && { tail -40 "$OUT/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }
fi
# A baseline tree in .base (e.g. `git archive <commit> | tar -x -C .base`, carried to the machine): built in
# place beside this one (its package imports from its own tree), for the A/B stages (host-ab).
if has base; then
  t0=$SECONDS
  (cd .base && FLASH_EQLINEAR_FORCE_CUDA_BUILD=1 python3 setup.py build_ext --inplace >"$OUT/build_base.log" 2>&1)
  rc=$?; summary+=("base build rc=$rc ($((SECONDS - t0)) s)")
  [ $rc -ne 0 ] && { tail -20 "$OUT/build_base.log"; printf '%s\n' "${summary[@]}"; exit 1; }
fi
python3 -c "import flash_eqlinear as fe; assert fe.kernels_available(), fe.ops.kernel_import_error()" || exit 1
if has test; then
  # A hung kernel would otherwise take the whole call: TEST_TIMEOUT seconds at most.
  timeout "${TEST_TIMEOUT:-400}" python3 -m pytest ${TEST_FILES:-tests/test_fwd_cuda.py tests/test_mlp_cuda.py tests/test_autocast_cuda.py} -q -x -p no:cacheprovider >"$OUT/test.log" 2>&1
  summary+=("tests: $(tail -1 "$OUT/test.log")")
  grep -E "FAILED|Error|assert" "$OUT/test.log" | head -20
fi
if has sanitize; then
  # SANITIZE_ARGS: the sets of sanitize_cases.py (default all), e.g. "gemm quick" or "hopper" (racecheck of
  # all of them, or of "fwd gemm", runs past the device's 10-minute limit)
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    # memcheck without the caching allocator (the variable counts when set at all): reads past a tensor
    # inside a cached block get reported too
    pre=""; [ "$tool" = memcheck ] && pre="env PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    $pre compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 benchmarks/sanitize_cases.py ${SANITIZE_ARGS:-} >"$OUT/sanitize_$tool.log" 2>&1
    rc=$?  # cuBLAS's own nvjet kernels draw racecheck reports: count those outside them apart
    summary+=("compute-sanitizer $tool rc=$rc ($(grep -cE '(ERROR|RACECHECK) SUMMARY: 0' "$OUT/sanitize_$tool.log") clean summaries, $(grep -E 'Race reported|Invalid|Error:' "$OUT/sanitize_$tool.log" | grep -vc nvjet) reports outside cuBLAS)")
  done
fi
if has bench; then
  python3 benchmarks/bench_op.py ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1; summary+=("bench rc=$?")
  tail -30 "$OUT/bench.log"
fi
if has bench-bwd; then
  # BENCH_BWD_ARGS: e.g. "--dtypes fp16,bf16 --cs 512,1024,2048"
  python3 benchmarks/bench_op.py --direction bwd ${BENCH_BWD_ARGS:-} >"$OUT/bench_bwd.log" 2>&1
  summary+=("bench-bwd rc=$?")
  grep "c=" "$OUT/bench_bwd.log"
fi
if has bench-train; then  # forward + backward; BENCH_TRAIN_ARGS as BENCH_BWD_ARGS
  python3 benchmarks/bench_op.py --direction train ${BENCH_TRAIN_ARGS:-} >"$OUT/bench_train.log" 2>&1
  summary+=("bench-train rc=$?")
  grep "c=" "$OUT/bench_train.log"
fi
if has bench-3xtf32; then  # the split-precision FP32 mode against exact FP32, same run (op_fwd_3xtf32.json)
  python3 benchmarks/bench_op.py --dtypes fp32,3xtf32 --cs 512,1024,2048 >"$OUT/bench_3xtf32.log" 2>&1
  summary+=("bench-3xtf32 rc=$?"); grep "c=" "$OUT/bench_3xtf32.log"
fi
if has bench-wgrad; then  # the 16-bit weight gradient and one layer's training step at ViT and op shapes
  python3 benchmarks/bench_weight_grad.py >"$OUT/bench_wgrad.log" 2>&1; summary+=("bench-wgrad rc=$?")
  grep "^|" "$OUT/bench_wgrad.log"
fi
# The bf16 training steps of EQ-ViT-B / -L against plain; $1: "" or "_TAG", TAG ending the result name
# (settings in the environment of the call; NET_TRAIN_MODES: "eager", "compiled" or both, comma-separated).
# bench_network.py names the file: net_vit_train.json for both modes, net_vit_train_eager[_TAG].json for eager.
net_train() {
  local modes=${NET_TRAIN_MODES:-eager}
  python3 benchmarks/bench_network.py --models vit --scales B,L --variants plain,flash --no-inference \
    --train vit-B,vit-L --train-modes "$modes" --tag "${1#_}" >"$OUT/net_train$1.log" 2>&1
  summary+=("net-train$1 rc=$?"); grep -E "^\| vit" "$OUT/net_train$1.log"
}
has net-train && net_train ""
# The same with the FP32 inputs cast in front of each layer (FLASH_EQLINEAR_DEBUG=fused_cast=0): the A/B, eager only
# (compiled graphs cast first whatever the switch says).
has net-train-cast && FLASH_EQLINEAR_DEBUG=fused_cast=0 NET_TRAIN_MODES=eager net_train _cast0
if has profile-bwd; then
  python3 benchmarks/dev/profile_bwd.py --cs 512,1024 >"$OUT/profile_bwd.log" 2>&1; summary+=("profile-bwd rc=$?")
  cat "$OUT/profile_bwd.log"
fi
if has profile-net; then  # kernel time per category: ViT-B training, Swin-B fp16 inference (or PROFILE_NET_ARGS)
  IFS=';' read -ra runs <<<"${PROFILE_NET_ARGS:---model vit --scale B --mode train;--model swin --scale B --mode infer --dtype fp16}"
  for a in "${runs[@]}"; do
    python3 benchmarks/dev/profile_network.py $a >>"$OUT/profile_net.log" 2>&1; summary+=("profile-net ($a) rc=$?")
  done
  grep -E "^\| " "$OUT/profile_net.log"
fi
if has net; then  # the ViT part of the network benchmark (the Swin results do not depend on fp16 kernels), with
  # the default training steps: net_infer_fp32-tf32-fp16_vit_train_eager.json
  python3 benchmarks/bench_network.py --models vit --scales B,L,H --dtypes fp32,tf32,fp16 >"$OUT/net.log" 2>&1
  summary+=("net rc=$?")
  tail -25 "$OUT/net.log"
fi
if has bench-quick; then
  python3 benchmarks/bench_op.py --cs 64,512,2048 --prec-rows 1024 --out quick.json >"$OUT/bench.log" 2>&1
  summary+=("bench-quick rc=$?"); tail -14 "$OUT/bench.log"
fi
if has host; then  # host (CPU) cost per layer call against nn.Linear
  python3 benchmarks/bench_host.py >"$OUT/host.log" 2>&1; summary+=("host rc=$?"); cat "$OUT/host.log"
fi
if has host-ab; then  # the same for the baseline tree (.base) and this one, in turn (HOST_ARGS: bench_host.py args)
  cp benchmarks/bench_host.py .base/benchmarks/bench_host.py
  for tree in base new base new; do
    dir=.; commit=${FLASH_EQLINEAR_COMMIT:-}; [ "$tree" = base ] && { dir=.base; commit=${BASE_COMMIT:-base}; }
    (cd "$dir" && FLASH_EQLINEAR_COMMIT=$commit python3 benchmarks/bench_host.py ${HOST_ARGS:-}) >>"$OUT/host_$tree.log" 2>&1
    summary+=("host-ab $tree rc=$?")
  done
  for tree in base new; do echo "== $tree"; grep -E "^\| [a-z]|^M =" "$OUT/host_$tree.log"; done
fi
if has narrow; then
  python3 benchmarks/dev/bench_narrow.py >"$OUT/narrow.log" 2>&1; summary+=("narrow rc=$?"); grep "^|" "$OUT/narrow.log"
fi
if has fp32-tiles; then  # each exact-FP32 tile forced, against F.linear (FP32_TILES_ARGS: e.g. "--cs 64,512")
  python3 benchmarks/dev/bench_fp32_tiles.py ${FP32_TILES_ARGS:-} >"$OUT/fp32_tiles.log" 2>&1; summary+=("fp32-tiles rc=$?")
  grep "^|" "$OUT/fp32_tiles.log"
fi
# One archive: $OUT brings back a limited number of files.
find benchmarks/results -type f -newer "$stamp" -print0 | tar czf "$OUT/results.tgz" --null -T - 2>/dev/null
printf '%s\n' "${summary[@]}"
