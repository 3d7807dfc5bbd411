#!/usr/bin/env bash
# Everything this project measures on an NVIDIA GPU machine, in one command, from the repository root:
#   bash benchmarks/run_h200.sh
# For a machine without network access, put the wheels it lacks in .whl/ first, e.g. FlashMLA
# (tokenspeed-flashmla, cp312, torch 2.11):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl tokenspeed-flashmla==1.0.0.post20260429
# Outputs land in $OUT (default benchmarks/out/h200, which git ignores; OUT=benchmarks/results/h200 replaces
# the recorded figures, benchmarks/results/README.md says which file each step writes).
# Steps slotrows and sglwindow compare SGLang 0.5.23's own ops where they import. For a machine without SGLang, run
# python3 benchmarks/sglang_site.py on one with it first: it writes .device/sglang/ (SGLang's own files of that import
# chain, and wheels of the packages in it that a GPU machine's image lacks), which those steps then take
# (CARRIED_SGLANG=DIR for another folder).
# STEPS="info bench" runs only some steps (fuzz (FUZZ_ENTRIES, FUZZ_BACKENDS pick some), memcheck, abwindow, abguard, abstep, vllmstep, hostfloor and hostprofile run only when named); TARGET_ARGS="--reps 5", BENCH_ARGS,
# SGLWINDOW_ARGS and PYTEST_ARGS pass options on.
set -uo pipefail
OUT=${OUT:-benchmarks/out/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
STEPS=${STEPS:-install info tests host targets slotrows sglwindow bench}
SITE=${SITE:-$(mktemp -d)}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
# The carried SGLang (see above), on PYTHONPATH for the steps that compare with it: its .py files, and its wheels
# installed as those of .whl/ are. tvm_ffi, which SGLang's import chain loads, may JIT-build an optional torch
# DLPack addon on first import; nothing timed here uses it, so it is switched off unless set.
CARRIED_SGLANG=${CARRIED_SGLANG:-.device/sglang}
SGLANG_PATH=
if [ -d "$CARRIED_SGLANG/src/sglang" ] && [[ " $STEPS " == *" slotrows "* || " $STEPS " == *" sglwindow "* || " $STEPS " == *" abwindow "* || " $STEPS " == *" hostfloor "* ]]; then
  SGLANG_DEPS=$(mktemp -d)
  if ! ls "$CARRIED_SGLANG"/wheels/*.whl >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target "$SGLANG_DEPS" "$CARRIED_SGLANG"/wheels/*.whl; then
    SGLANG_PATH=$(cd "$CARRIED_SGLANG/src" && pwd):$SGLANG_DEPS
    echo "SGLang from $CARRIED_SGLANG for slotrows and sglwindow"
  fi
fi
with_sglang() {
  if [ -n "$SGLANG_PATH" ]; then
    env PYTHONPATH="$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH}" \
      TVM_FFI_DISABLE_TORCH_C_DLPACK="${TVM_FFI_DISABLE_TORCH_C_DLPACK:-1}" "$@"
  else
    "$@"
  fi
}
for step in $STEPS; do
  case $step in
    install)
      python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3
      python3 -m pip install -q --no-deps --no-build-isolation --no-index ./examples/swa-hal-example-backend 2>&1 | tail -3
      ;;
    info)
      { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; swa-hal info --status \
          --config configs/deepseek_v4_flash.yaml --device cuda; } 2>&1 | tee "$OUT/info.txt"
      ;;
    tests)
      timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA \
        ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "RESULT|passed|failed|error|Error" | tail -60
      ;;
    host)
      timeout 120 python3 benchmarks/host_overhead.py 2>&1 | tee "$OUT/host_overhead.txt"
      timeout 60 python3 benchmarks/launch_probe.py 2>&1 | tee "$OUT/launch_probe.txt"
      timeout 120 python3 benchmarks/kernel_gpu_time.py 2>&1 | tee "$OUT/kernel_gpu_time.txt"
      ;;
    multi)
      timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu tests/gpu/test_multi_gpu.py -p no:cacheprovider -q -rA \
        2>&1 | tee "$OUT/multi_gpu.log" | grep -E "RESULT|passed|failed|error|Error|SKIP" | tail -20
      ;;
    targets)
      timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_build.py --targets only --out "$OUT" ${TARGET_ARGS:-} 2>&1 | grep -v USDT \
        | tee "$OUT/targets.log" | tail -30
      ;;
    slotrows)
      # SGLang's own dsv4 ops are compared when importable (the carried SGLang, or one on PYTHONPATH).
      with_sglang timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/sglang_rows.py 2>&1 | grep -v USDT \
        | tee "$OUT/sglang_rows.txt" | tail -30
      ;;
    sglwindow)
      # DeepSeek-V4.1's request-window layout against SGLang's own window_layout (swa_hal alone without SGLang).
      with_sglang timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/sglang_window.py ${SGLWINDOW_ARGS:-} 2>&1 \
        | grep -v USDT | tee "$OUT/sglang_window.txt" | tail -45
      ;;
    abwindow)
      # The request-window layout of two source trees in turn (AB_BEFORE, default .device/before, then this
      # one), AB_ROUNDS rounds, each against SGLang's window_layout in the same process: before/after ratios.
      for ((r = 1; r <= ${AB_ROUNDS:-2}; r++)); do
        for tree in "${AB_BEFORE:-.device/before}" .; do
          tree=$(cd "$tree" && pwd)
          root=$PWD  # the path printed relative to the repository root
          echo "== round $r, swa_hal from $(cd /tmp && PYTHONPATH="$tree" python3 -c \
            "import swa_hal, os; print(os.path.relpath(os.path.dirname(swa_hal.__file__), '$root'))")"
          PYTHONPATH="$tree:$tree/backends${PYTHONPATH:+:$PYTHONPATH}" with_sglang timeout ${BENCH_TIMEOUT:-200} \
            python3 benchmarks/sglang_window.py --steps 0 --reps 1 ${SGLWINDOW_ARGS:-} 2>&1 | grep -E "==|host|kernel|which|swa_hal backend"
        done
      done 2>&1 | tee "$OUT/ab_window.txt"
      ;;
    fuzz)
      # The guarded-output fuzz, natively, one process per backend and entry point side by side; the
      # token-slot entries compile a kernel per key (dtypes, widths, ring sizes), so they split further:
      # one process per window, the ring rows FUZZ_SHARDS ways (each shard its own seeds).
      fuzz_run() { timeout ${FUZZ_TIMEOUT:-540} python3 benchmarks/fuzz_guarded.py --device cuda --backends "$@" \
        --cases ${FUZZ_CASES:-5000} --seed ${FUZZ_SEED:-long}; }
      # FUZZ_ENTRIES and FUZZ_BACKENDS pick some (default: every entry point of every backend).
      shards=${FUZZ_SHARDS:-2}
      entries=" ${FUZZ_ENTRIES:-build groups settings validated slot_rows ring_rows request_window} "
      for b in ${FUZZ_BACKENDS:-cuda sm12x rocm xpu torch}; do
        for e in build groups settings validated; do
          if [[ $entries == *" $e "* ]]; then fuzz_run $b --entries $e > "$OUT/fuzz_$b-$e.part" 2>&1 & fi
        done
        for w in 8 20; do
          if [[ $entries == *" slot_rows "* ]]; then
            fuzz_run $b --entries slot_rows --windows $w > "$OUT/fuzz_$b-slot-$w.part" 2>&1 &
          fi
          if [[ $entries == *" request_window "* ]]; then
            fuzz_run $b --entries request_window --windows $w > "$OUT/fuzz_$b-window-$w.part" 2>&1 &
          fi
          for ((k = 0; k < shards; k++)); do
            if [[ $entries == *" ring_rows "* ]]; then
              fuzz_run $b --entries ring_rows --windows $w --shard $k/$shards > "$OUT/fuzz_$b-ring-$w-$k.part" 2>&1 &
            fi
          done
        done
      done
      wait
      cat "$OUT"/fuzz_*.part | grep -v -e Warning -e '^  \.\.\. ' > "$OUT/fuzz_guarded.txt"; rm -f "$OUT"/fuzz_*.part
      grep -E " differ " "$OUT/fuzz_guarded.txt" | sort
      awk '/^total:/ {n += $2; d += $5; o += $10} END {print "all processes: " n " malformed inputs, " d \
        " differ from the reference, " o " indices outside the cache"}' "$OUT/fuzz_guarded.txt" \
        | tee -a "$OUT/fuzz_guarded.txt"
      ;;
    memcheck)
      # A slice of the same fuzz under compute-sanitizer's memcheck, one allocation per tensor (no caching
      # allocator, so a read past a tensor is past its allocation), one process per Triton backend.
      for b in cuda sm12x rocm xpu; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${MEMCHECK_TIMEOUT:-540} compute-sanitizer --tool memcheck \
          --print-limit 20 python3 benchmarks/fuzz_guarded.py --device cuda --backends $b \
          --cases ${MEMCHECK_CASES:-60} --seed memcheck > "$OUT/memcheck_$b.part" 2>&1 &
      done
      wait
      cat "$OUT"/memcheck_*.part | grep -v -e Warning -e '^  \.\.\. ' > "$OUT/fuzz_memcheck.txt"; rm -f "$OUT"/memcheck_*.part
      grep -E "cases|total|ERROR SUMMARY" "$OUT/fuzz_memcheck.txt"
      ;;
    abguard)
      # The Triton kernel's guard cost, guarded and unguarded, of two source trees in turn (AB_BEFORE, default
      # .device/before, then this one), AB_ROUNDS rounds, each tree's own kernel_sweep.py (one setting: 4 warps,
      # 4096-element tiles): the guarded/unguarded ratio of each tree, interleaved.
      for ((r = 1; r <= ${AB_ROUNDS:-3}; r++)); do
        for tree in "${AB_BEFORE:-.device/before}" .; do
          echo "== round $r, swa_hal from $tree"
          (cd "$tree" && PYTHONPATH="$PWD:$PWD/backends${PYTHONPATH:+:$PYTHONPATH}" WARPS=4 TILES=4096 \
            timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/kernel_sweep.py 2>&1 | grep -v USDT)
        done
      done 2>&1 | tee "$OUT/ab_guard.txt"
      ;;
    abstep)
      # The vLLM step of benchmarks/vllm_step.py with two source trees in turn (AB_BEFORE, default .device/before,
      # then this one), AB_ROUNDS rounds, on one pinned core: each tree's swa_hal through this tree's script.
      for ((r = 1; r <= ${AB_ROUNDS:-2}; r++)); do
        for tree in "${AB_BEFORE:-.device/before}" .; do
          [ "$tree" = . ] || cp benchmarks/vllm_step.py benchmarks/common.py "$tree/benchmarks/"
          echo "== round $r, swa_hal from $tree"  # the path as given, relative to the repository root
          taskset -c ${PIN_CORE:-5} timeout ${BENCH_TIMEOUT:-200} python3 "$tree/benchmarks/vllm_step.py" \
            ${VLLMSTEP_ARGS:-} 2>&1 | grep -E "==|rep |ratio|^(plugin step|step build|8 )"
        done
      done 2>&1 | tee "$OUT/ab_step.txt"
      ;;
    vllmstep)
      # A vLLM step of 8 SWA groups x decode-256 through the step path, against 8 single builds and 8 engine
      # launch sequences (benchmarks/vllm_step.py), on one pinned core.
      taskset -c ${PIN_CORE:-5} timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/vllm_step.py ${VLLMSTEP_ARGS:-} 2>&1 \
        | grep -v USDT | tee "$OUT/vllm_step.txt" | tail -14
      ;;
    hostfloor)
      # The host-time floor of the SGLang adapter's call and of the vLLM plugin step (benchmarks/host_floor.py): the
      # launch, allocation and input reads alone against the targets, on one pinned core, SGLang's ops where they import.
      with_sglang taskset -c ${PIN_CORE:-5} timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/host_floor.py ${HOSTFLOOR_ARGS:-} 2>&1 \
        | grep -v USDT | tee "$OUT/host_floor.txt" | tail -16
      ;;
    hostprofile)
      # Where each host path's time goes (benchmarks/host_profile.py), on one pinned core.
      taskset -c ${PIN_CORE:-5} timeout 300 python3 benchmarks/host_profile.py ${HOSTPROFILE_ARGS:-} 2>&1 | grep -v USDT \
        > "$OUT/host_profile.txt"; grep -E "primitive|===" "$OUT/host_profile.txt"
      ;;
    bench)
      timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_build.py --targets no --out "$OUT" ${BENCH_ARGS:-} 2>&1 | grep -v USDT | tee "$OUT/bench.log" | tail -30
      ;;
  esac
done
