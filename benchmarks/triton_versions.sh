#!/usr/bin/env bash
# The kernels on two Triton releases on one NVIDIA GPU machine: the machine's own (triton 3.6 on this
# project's H200 image) and the release the engines pin (triton 3.8, through torch 2.14), from the repository
# root. docs/kernels.md #triton-versions says what is checked and why.
#
#   TRITON_B=DIR bash benchmarks/triton_versions.sh tests-a     # the GPU suite on the machine's Triton
#   TRITON_B=DIR bash benchmarks/triton_versions.sh tests-b     # the GPU suite on the Triton installed in DIR
#   TRITON_B=DIR bash benchmarks/triton_versions.sh ab          # kernel and host times, alternated a b a b
#   TRITON_B=DIR SWEEP="SWA_HAL_TILE_ELEMS=2048 ..." bash benchmarks/triton_versions.sh sweep   # settings on b
#
# DIR holds an installed triton package (a wheel unpacked there: `python3 -m pip install --no-deps --target DIR
# triton==3.8.0`, or the wheel's files extracted into DIR). For a machine without network access, a trimmed copy
# travels as split archives: TRITON_B_PARTS="a/triton.tar.xz.00 b/triton.tar.xz.01" joins and unpacks them
# into DIR first. FlashMLA and other wheels in .whl/ are installed as benchmarks/run_h200.sh does.
# Outputs land in $OUT (default benchmarks/out/triton_versions).
set -uo pipefail
OUT=${OUT:-benchmarks/out/triton_versions}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
TRITON_B=${TRITON_B:?set TRITON_B to a folder holding the second Triton}
SITE=${SITE:-$(mktemp -d)}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3
if [ -n "${TRITON_B_PARTS:-}" ] && [ ! -d "$TRITON_B/triton" ]; then
  mkdir -p "$TRITON_B"
  # shellcheck disable=SC2086
  cat $TRITON_B_PARTS | xz -d | tar xf - -C "$TRITON_B" || exit 1
fi
# Each Triton compiles into a cache of its own (the two releases must not share compiled kernels).
a() { env TRITON_CACHE_DIR=/tmp/triton-cache-a "$@"; }
# Side b finds its backends in its own tree: the machine's Triton's entry points would name backends a trimmed
# copy leaves out (AMD's).
b() { env PYTHONPATH="$TRITON_B:${PYTHONPATH:-}" TRITON_CACHE_DIR=/tmp/triton-cache-b TRITON_BACKENDS_IN_TREE=1 "$@"; }
versions='import torch, triton; from swa_hal.kernels.launch import launcher_layout; print("torch", torch.__version__, "triton", triton.__version__, "launcher", launcher_layout())'
gpu_tests() {  # $1: a or b
  "$1" python3 -c "$versions" | tee "$OUT/gpu_tests_$1.log"
  "$1" timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA ${PYTEST_ARGS:-} \
    2>&1 | tee -a "$OUT/gpu_tests_$1.log" | grep -E "RESULT|passed|failed|error|Error" | tail -40
}
for step in "$@"; do
  case $step in
    tests-a) gpu_tests a ;;
    tests-b) gpu_tests b ;;
    ab)
      # Alternated, so the host's phases fall on both releases alike: a b a b, each the targets' kernel and host times.
      for round in 1 2; do
        for side in a b; do
          "$side" python3 -c "$versions" | tee -a "$OUT/ab.txt"
          "$side" timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_build.py --targets only \
            --out "$OUT/ab_${side}_$round" ${TARGET_ARGS:-} 2>&1 | grep -v USDT | tee -a "$OUT/ab.txt" | tail -14
        done
      done
      ;;
    sweep)
      # The kernels' tile and warp settings (docs/kernels.md #settings) on side b, one targets run each, with
      # side a's defaults first: SWEEP="SWA_HAL_TILE_ELEMS=2048 SWA_HAL_NUM_WARPS=8 ..." (one setting a run).
      a python3 -c "$versions" | tee -a "$OUT/sweep.txt"
      a timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_build.py --targets only --reps 1 --out "$OUT/sweep_a" \
        2>&1 | grep -E "^(mixed|long_prefill|decode_only) +kernel " | sed 's/^/a defaults  /' | tee -a "$OUT/sweep.txt"
      for setting in defaults ${SWEEP:-}; do
        extra=(); [ "$setting" != defaults ] && extra=("$setting")
        b env "${extra[@]}" timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_build.py --targets only --reps 1 \
          --out "$OUT/sweep_b" 2>&1 | grep -E "^(mixed|long_prefill|decode_only) +kernel " \
          | sed "s/^/b $setting  /" | tee -a "$OUT/sweep.txt"
      done
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
