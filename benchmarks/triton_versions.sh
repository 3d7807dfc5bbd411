#!/usr/bin/env bash
# The kernels on three Triton releases on one NVIDIA GPU machine, in one call from the repository root: the
# machine's own (triton 3.6 with torch 2.11 + CUDA 13.0 on this project's H200 image), 3.8 (the engines' pin
# through torch 2.14) and 3.9 (torch 2.15's), each release in its own folder on PYTHONPATH over the machine's
# torch. docs/kernels.md #triton-versions says what is checked and why.
#
#   bash benchmarks/triton_versions.sh                    # STEPS="install versions tests kernels"
#   STEPS="versions kernels" REPS=3 bash benchmarks/triton_versions.sh
#
# Steps:
#   install   swa_hal (editable, no dependencies), the wheels of .whl/ as benchmarks/run_h200.sh installs
#             them, and each carried triton wheel into a folder of its own (/tmp/triton-VERSION)
#   versions  torch, triton and the launch path (`swa-hal info`'s line) of each release
#   tests     the GPU suite (pytest -m gpu tests/gpu) on every release at once, one process each, a log each
#             (the suite asserts no timings; one after another, the three would take 12-15 minutes, as each
#             took 4-5 on the H200, too long for one call of 10)
#   kernels   the kernels' GPU times (benchmarks/kernel_sweep.py: decode-256, the 16k-row prefill and a mixed
#             batch, guarded and not), REPS rounds, every release once a round, each round in another order
#             (3.6 3.8 3.9, then 3.8 3.9 3.6, ...), then each release's medians and its ratio to the first;
#             with AB_KERNEL=FILE (another version of kernels/swa_metadata.py) both kernels, this one's ratio to it
#   ab        bench_build.py --targets only (kernel and host times), alternated the same way (not by default)
#   settings  the kernels' tile and warp settings (SWEEP=...) on one release (not by default; see the step)
#
# What to carry (the machine has no network access): the trimmed triton wheels in .whl/triton/ (git ignores
# .whl/), made on any machine with network access by
#   bash benchmarks/trim_triton_wheel.sh 3.8.0 .whl/triton; bash benchmarks/trim_triton_wheel.sh 3.9.0 .whl/triton
# (cp312 x86-64 wheels without the AMD backend, the profiler's libraries, the unused ptxas and the debug
# sections: 3.8.0's is 51.2 MiB, from 237; 3.9.0's 55.6 MiB, from 272). The wheels .whl/ holds for
# benchmarks/run_h200.sh (FlashMLA) are not needed here. Where one transfer carries less than both triton wheels (with a 64 MiB limit, one
# wheel and the repository fit, two do not), send them in turns to a folder that stays on the machine
# between transfers and name it: TRITON_WHEELS=DIR. A release whose wheel is missing is left out, with a line
# saying so.
# RELEASES="3.8.0 3.9.0" picks the carried releases; the machine's own always runs first.
# Outputs land in $OUT (default benchmarks/out/triton_versions): versions.txt, gpu_tests_<release>.log,
# kernels.txt (every run's line and the summary), ab.txt, settings.txt.
set -uo pipefail
OUT=${OUT:-benchmarks/out/triton_versions}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
STEPS=${STEPS:-install versions tests kernels}
RELEASES=${RELEASES:-3.8.0 3.9.0}
TRITON_WHEELS=${TRITON_WHEELS:-.whl/triton}
REPS=${REPS:-2}
# The soak (minutes of builds) is left out unless PYTEST_ARGS says otherwise (PYTEST_ARGS= runs it).
PYTEST_ARGS=${PYTEST_ARGS---deselect=tests/gpu/test_soak.py::test_soak}
SITE=${SITE:-$(mktemp -d)}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
machine=$(python3 -c 'import triton; print(triton.__version__)')
sides=("$machine")
for r in $RELEASES; do
  if [ -d "/tmp/triton-$r/triton" ] || ls "$TRITON_WHEELS"/triton-"$r"-*.whl >/dev/null 2>&1; then
    sides+=("$r")
  else
    echo "triton $r: no wheel in $TRITON_WHEELS (bash benchmarks/trim_triton_wheel.sh $r $TRITON_WHEELS): left out"
  fi
done
# Each release compiles into a cache of its own (releases must not share compiled kernels) and, but for the
# machine's, finds its backends in its own tree (TRITON_BACKENDS_IN_TREE: the machine's Triton's entry points
# would name backends a trimmed copy leaves out).
on() {  # on RELEASE command...: run command under that Triton
  local r=$1
  shift
  if [ "$r" = "$machine" ]; then
    env TRITON_CACHE_DIR="/tmp/triton-cache-$r" "$@"
  else
    env PYTHONPATH="/tmp/triton-$r:${PYTHONPATH:-}" TRITON_CACHE_DIR="/tmp/triton-cache-$r" TRITON_BACKENDS_IN_TREE=1 "$@"
  fi
}
versions='import torch, triton; from swa_hal.kernels.launch import launcher_report; print("torch", torch.__version__, "triton", triton.__version__, "|", launcher_report()["detail"])'
# Round k runs the releases rotated by k: each release runs first, middle and last in turn.
order() {
  local k=$1 n=${#sides[@]} i
  for ((i = 0; i < n; i++)); do printf '%s ' "${sides[$(((i + k) % n))]}"; done
}
for step in $STEPS; do
  case $step in
    install)
      python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3
      for r in "${sides[@]:1}"; do
        [ -d "/tmp/triton-$r/triton" ] && continue
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "/tmp/triton-$r" \
          "$TRITON_WHEELS"/triton-"$r"-*.whl 2>&1 | tail -3
      done
      ;;
    versions)
      for r in "${sides[@]}"; do on "$r" python3 -c "$versions"; done 2>&1 | tee "$OUT/versions.txt"
      ;;
    tests)
      for r in "${sides[@]}"; do
        { on "$r" python3 -c "$versions"
          on "$r" timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA \
            $PYTEST_ARGS; } > "$OUT/gpu_tests_$r.log" 2>&1 &
      done
      wait
      for r in "${sides[@]}"; do
        echo "== triton $r"
        grep -E "^torch |RESULT|passed|failed|error|Error" "$OUT/gpu_tests_$r.log" | tail -40
      done
      ;;
    kernels)
      # One kernel_sweep.py process per release and round, at the kernels' default settings (4 warps, the
      # default tiles): each prints one line of GPU times (us), prefixed here with its release. With
      # AB_KERNEL=FILE (another version of kernels/swa_metadata.py, same signature) each run also times that
      # kernel (KERNELS=, its own process), and the summary is this tree's kernel against it per release.
      for ((k = 0; k < REPS; k++)); do
        for r in $(order "$k"); do
          on "$r" env WARPS=4 TILES=4096 KERNELS="${AB_KERNEL:-}" timeout "${BENCH_TIMEOUT:-200}" \
            python3 benchmarks/kernel_sweep.py 2>&1 | grep "^kernel " | sed "s/^/triton $r round $((k + 1)): /"
        done
      done | tee "$OUT/kernels.txt"
      python3 - "$OUT/kernels.txt" "${sides[@]}" <<'EOF' | tee -a "$OUT/kernels.txt"
import re, statistics, sys
path, *sides = sys.argv[1:]
times = {}  # (shape, release, kernel: this tree's or the other) -> [us]
for line in open(path):
    m = re.match(r"triton (\S+) round \d+: kernel (\S+) .*?: (.*)", line)
    if not m:
        continue
    kernel = "this" if m.group(2) == "current" else "other"
    for part in m.group(3).split("; "):
        shape = re.match(r"(.*) (\d+\.\d+) us", part)
        if shape:
            times.setdefault((shape.group(1).strip(), m.group(1), kernel), []).append(float(shape.group(2)))
shapes = list(dict.fromkeys(s for s, _, _ in times))
other = any(k == "other" for _, _, k in times)
print("\nmedian kernel us per release, " + ("this tree's kernel / the other (AB_KERNEL)" if other else
      "and the ratio to triton " + sides[0]))
print(f"{'shape':<34}" + "".join(f"{'triton ' + r:>28}" for r in sides))
for shape in shapes:
    cells = []
    for r in sides:
        this = times.get((shape, r, "this"))
        base = times.get((shape, r, "other") if other else (shape, sides[0], "this"))
        if not this or not base:
            cells.append(f"{'-':>28}")
            continue
        a, b = statistics.median(this), statistics.median(base)
        cells.append((f"{a:>7.2f} / {b:<7.2f}" if other else f"{a:>10.2f}") + f" ({a / b:5.3f}x)")
    print(f"{shape:<34}" + "".join(f"{c:>28}" for c in cells))
EOF
      ;;
    ab)
      for ((k = 0; k < REPS; k++)); do
        for r in $(order "$k"); do
          on "$r" python3 -c "$versions"
          on "$r" timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_build.py --targets only \
            --out "$OUT/ab_${r}_$((k + 1))" ${TARGET_ARGS:-} 2>&1 | grep -v USDT | tail -14
        done
      done 2>&1 | tee "$OUT/ab.txt"
      ;;
    settings)
      # The kernels' tile and warp settings (docs/kernels.md #settings) on one release (SETTINGS_ON, default
      # the last carried), one targets run each after the machine's release at its defaults:
      # SWEEP="SWA_HAL_TILE_ELEMS=2048 SWA_HAL_NUM_WARPS=8 ..." (one setting a run).
      target=${SETTINGS_ON:-${sides[-1]}}
      on "$machine" python3 -c "$versions" | tee -a "$OUT/settings.txt"
      on "$machine" timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_build.py --targets only --reps 1 \
        --out "$OUT/settings_$machine" 2>&1 | grep -E "^(mixed|long_prefill|decode_only) +kernel " \
        | sed "s/^/$machine defaults  /" | tee -a "$OUT/settings.txt"
      on "$target" python3 -c "$versions" | tee -a "$OUT/settings.txt"
      for setting in defaults ${SWEEP:-}; do
        extra=(); [ "$setting" != defaults ] && extra=("$setting")
        on "$target" env "${extra[@]}" timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_build.py --targets only \
          --reps 1 --out "$OUT/settings_$target" 2>&1 | grep -E "^(mixed|long_prefill|decode_only) +kernel " \
          | sed "s/^/$target $setting  /" | tee -a "$OUT/settings.txt"
      done
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
