#!/usr/bin/env bash
# A triton wheel cut down to what swa_hal's kernels need on one NVIDIA GPU, small enough to carry to a
# machine without network access (benchmarks/triton_versions.sh installs it there):
#
#   bash benchmarks/trim_triton_wheel.sh 3.9.0 [OUTDIR]        # fetch the cp312 x86-64 wheel, trim it
#   bash benchmarks/trim_triton_wheel.sh path/to/triton-*.whl [OUTDIR]
#
# Left out: the AMD backend (triton finds its backends by directory, so it simply has none), the profiler's
# CUPTI libraries and proton's library (only triton.profiler loads them), the test-only instrumentation and
# plugin libraries, the ptxas this release does not run for the target (KEEP_PTXAS, default by release:
# triton 3.9 assembles for sm90 and newer with ptxas-blackwell, 3.6 to 3.8 with ptxas below sm100), and the
# shared libraries' debug sections and static symbol tables (strip --strip-unneeded: the loader reads only
# the dynamic ones). Entries are stored LZMA-compressed (a zip method pip installs from). RECORD is
# rewritten with the new hashes, so pip installs the result as it would the original. The wheel is written
# to OUTDIR (default .whl/triton, where benchmarks/triton_versions.sh looks), named as the original; its size
# is printed. Checked on a CPU: the trimmed 3.9.0 wheel installs under CPython 3.12 and compiles a kernel for
# sm90 (triton.compile with GPUTarget("cuda", 90, 32)).
set -euo pipefail
SRC=${1:?a triton version or wheel}
OUTDIR=${2:-.whl/triton}
PYVER=${PYVER:-3.12}
mkdir -p "$OUTDIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ -f "$SRC" ]; then
  WHEEL=$SRC
else
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$WORK" "triton==$SRC"
  WHEEL=$(ls "$WORK"/triton-*.whl)
fi
python3 - "$WHEEL" "$OUTDIR" "$WORK" <<'EOF'
import base64, hashlib, os, re, subprocess, sys, zipfile

wheel, outdir, work = sys.argv[1:4]
name = os.path.basename(wheel)
version = tuple(int(p) for p in name.split("-")[1].split(".")[:2])
keep_ptxas = os.environ.get("KEEP_PTXAS") or ("ptxas-blackwell" if version >= (3, 9) else "ptxas")
drop_ptxas = {"ptxas", "ptxas-blackwell"} - {keep_ptxas}
dropped = [
    re.compile(r"triton/backends/amd/"),
    re.compile(r"triton/backends/nvidia/lib/cupti"),
    re.compile(r"triton/_C/libproton\.so"),
    re.compile(r"triton/instrumentation/lib.*TestLib"),
    re.compile(r"triton/plugins/lib.*TestLib"),
    *(re.compile(rf"triton/backends/nvidia/bin/{re.escape(p)}$") for p in drop_ptxas),
]


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


out = os.path.join(outdir, name)
kept = dropped_bytes = 0
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_LZMA) as dst:
    record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
    records = []
    for info in src.infolist():
        if info.filename == record_name:
            continue
        if any(p.match(info.filename) for p in dropped):
            dropped_bytes += info.file_size
            continue
        data = src.read(info)
        if re.search(r"\.so(\.|$)", info.filename) and data[:4] == b"\x7fELF":
            path = os.path.join(work, "lib.so")
            with open(path, "wb") as fh:
                fh.write(data)
            subprocess.run(["strip", "--strip-unneeded", path], check=True)
            with open(path, "rb") as fh:
                data = fh.read()
        entry = zipfile.ZipInfo(info.filename, info.date_time)
        entry.external_attr = info.external_attr  # keeps the executables' mode bits (ptxas, nvdisasm)
        entry.compress_type = zipfile.ZIP_LZMA
        dst.writestr(entry, data)
        records.append(f"{info.filename},{digest(data)},{len(data)}")
        kept += len(data)
    records.append(f"{record_name},,")
    dst.writestr(zipfile.ZipInfo(record_name, (2020, 1, 1, 0, 0, 0)), "\n".join(records) + "\n")
print(
    f"{out}: {os.path.getsize(out) / 2**20:.1f} MiB (from {os.path.getsize(wheel) / 2**20:.1f} MiB); "
    f"{kept / 2**20:.0f} MiB installed, {dropped_bytes / 2**20:.0f} MiB left out; kept {keep_ptxas}"
)
EOF
