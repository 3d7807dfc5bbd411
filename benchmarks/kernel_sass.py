#!/usr/bin/env python
"""Compile the build kernel for SM90 on any machine (no GPU needed: Triton bundles ptxas and cuobjdump) and
print what decides its speed: registers, layout conversions (each a shared-memory round trip with a barrier),
global loads and stores (vector or scalar) and the SASS instruction mix.

    python3 benchmarks/kernel_sass.py [--no-guard] [--noncausal] [--config configs/deepseek_v4_flash.yaml] [--out DIR] [--kernel FILE]

``--out`` also writes the TTGIR, PTX and SASS there; ``--kernel`` compiles another version of
``kernels/swa_metadata.py`` (same signature) instead, as ``kernel_sweep.py``'s ``KERNELS=`` times one.
Pointers Triton would specialise on 16-byte alignment (every buffer of the builder's, not the engine's
tensors) are declared so, as a real launch compiles them.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swa_hal import SWAConfig  # noqa: E402
from swa_hal.kernels.launch import compile_options, num_warps  # noqa: E402
from swa_hal.kernels.rows_launch import rows_key  # noqa: E402
from swa_hal.kernels.rows_launch import ROWS_ENGINE, ROWS_POINTERS  # noqa: E402
from swa_hal.kernels.swa_metadata import swa_metadata_kernel  # noqa: E402

TRITON_TYPES = {torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1"}
POINTERS = {name: TRITON_TYPES[dtype] for name, dtype in ROWS_POINTERS.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(ROOT / "configs" / "deepseek_v4_flash.yaml"))
    parser.add_argument("--noncausal", action="store_true", help="the DSpark (non-causal) key; needs a DSpark config")
    parser.add_argument("--no-guard", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--kernel", help="another version of swa_hal/kernels/swa_metadata.py to compile")
    args = parser.parse_args()
    kernel_fn = swa_metadata_kernel
    if args.kernel:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from kernel_sweep import variant_kernel

        kernel_fn = variant_kernel(args.kernel)
    key = rows_key(SWAConfig.from_yaml(args.config), causal=not args.noncausal, clamp=False, device_type="cuda",
                       guard=not args.no_guard)
    constexprs = key.constexprs()
    names = kernel_fn.arg_names
    signature = {n: POINTERS.get(n, "constexpr" if n in constexprs else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in POINTERS and n not in ROWS_ENGINE}
    kernel = triton.compile(ASTSource(kernel_fn, signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=compile_options())
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    out = Path(args.out) if args.out else Path(os.environ.get("TMPDIR", "/tmp")) / "swa_hal_sass"
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.cubin").write_bytes(kernel.asm["cubin"])
    (out / "kernel.ttgir").write_text(kernel.asm["ttgir"])
    (out / "kernel.ptx").write_text(kernel.asm["ptx"])
    sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(out / "kernel.cubin")],
                          capture_output=True, text=True, check=True).stdout
    (out / "kernel.sass").write_text(sass)
    usage = subprocess.run([str(bin_dir / "cuobjdump"), "-res-usage", str(out / "kernel.cubin")],
                           capture_output=True, text=True, check=True).stdout
    ops = [m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)]
    ptx = kernel.asm["ptx"]
    print(f"{key}\nguard {not args.no_guard}, {num_warps()} warps; files in {out}")
    print("registers:", ", ".join(re.findall(r"REG:\d+", usage)))
    print("layout conversions (TTGIR):", kernel.asm["ttgir"].count("ttg.convert_layout"))
    for kind in ("st.global.v4", "st.global.b32", "ld.global.b32", "ld.global.b64", "bar.sync"):
        print(f"{kind:<14} {ptx.count(kind)} in the PTX")
    print(f"SASS: {len(ops)} instructions; most frequent:",
          ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(12)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
