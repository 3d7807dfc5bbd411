"""What hardware this is. The only module that asks torch (or NVML) about the machine: the platform a
builder's backend is chosen for (``probe_platform``) and whether a device can hold its builds
(``builder_device``).

``PlatformInfo`` is a plain frozen value so tests and ``--assume`` can describe any platform by hand;
backends decide availability from it alone, never by probing again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import TYPE_CHECKING, Any

from .envs import FALSE_WORDS, TRUE_WORDS, env_flag
from .errors import DeviceError

if TYPE_CHECKING:
    import torch

# The keys ``--assume`` takes (PlatformInfo.from_assume), the other spellings it accepts for some, and the
# prefix of a third-party backend's own facts.
ASSUME_KEYS = ("vendor", "capability", "arch", "name", "triton", "interpret", "devices")
ASSUME_ALIASES = {"cc": "capability", "sm": "capability", "device_name": "name"}
EXTRA_PREFIX = "x-"


def _parse_bool(key: str, text: str) -> bool:
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(f"--assume {key}={text!r}: expected 1/0, true/false, yes/no")


def _parse_capability(text: str) -> tuple[int, int]:
    parts = text.strip().split(".")
    try:
        if len(parts) == 1 and len(parts[0]) >= 2:  # "90" / "120" as CUDA writes sm_90
            return int(parts[0][:-1]), int(parts[0][-1])
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise ValueError(f"--assume capability={text!r}: expected MAJOR.MINOR, e.g. 9.0 or 12.0")


@dataclasses.dataclass(frozen=True)
class PlatformInfo:
    """The facts backends decide on.

    vendor: "cuda", "rocm", "xpu", "cpu", or any other name a third-party backend knows.
    capability: (major, minor) for CUDA and ROCm devices, else None.
    arch: a finer architecture name where the vendor has one (ROCm "gfx942", "sm_90a", ...).
    triton: whether Triton can run here (installed, or the interpreter is on).
    triton_interpret: whether TRITON_INTERPRET is set, so Triton kernels run on the CPU.
    synthetic: True for platforms described by hand (``from_assume``), not probed.
    """

    vendor: str = "cpu"
    capability: tuple[int, int] | None = None
    arch: str | None = None
    device_name: str | None = None
    device_count: int = 0
    triton: bool = False
    triton_interpret: bool = False
    torch_version: str = ""
    runtime_version: str | None = None
    synthetic: bool = False
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def capability_str(self) -> str | None:
        return None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"

    def describe(self) -> str:
        bits = [self.vendor]
        if self.capability is not None:
            bits.append(f"capability {self.capability_str}")
        if self.arch:
            bits.append(self.arch)
        if self.device_name:
            bits.append(self.device_name)
        if self.synthetic:
            bits.append("(assumed)")
        return ", ".join(bits)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["capability"] = self.capability_str
        out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_assume(cls, text: str) -> PlatformInfo:
        """Parse ``vendor=cuda,capability=12.0[,arch=...,triton=0,name=...,x-KEY=VALUE]``.

        The keys are ``ASSUME_KEYS`` (with the aliases ``ASSUME_ALIASES``); any other is a ValueError naming
        it and the accepted ones, as is a key given twice: a mistyped key must not quietly leave a fact out,
        which would select another backend than the one asked about. A third-party backend's own facts go
        through ``x-KEY=VALUE`` and are read back with ``get("KEY")``.
        A synthetic GPU platform assumes Triton is present unless ``triton=0``.
        """
        fields: dict[str, Any] = {"synthetic": True}
        extra: dict[str, str] = {}
        given: set[str] = set()
        for item in (p for p in text.split(",") if p.strip()):
            if "=" not in item:
                raise ValueError(f"--assume item {item.strip()!r} is not KEY=VALUE")
            key, value = (s.strip() for s in item.split("=", 1))
            key = key.lower()
            if key.startswith(EXTRA_PREFIX) and len(key) > len(EXTRA_PREFIX):
                name = key[len(EXTRA_PREFIX) :]
            else:
                name = ASSUME_ALIASES.get(key, key)
                if name not in ASSUME_KEYS:
                    raise ValueError(
                        f"--assume key {key!r} is not one of {', '.join(ASSUME_KEYS)} (aliases: "
                        f"{', '.join(f'{a}={k}' for a, k in ASSUME_ALIASES.items())}); a backend's own facts are "
                        f"{EXTRA_PREFIX}KEY=VALUE"
                    )
            slot = key if key.startswith(EXTRA_PREFIX) else name
            if slot in given:
                raise ValueError(f"--assume key {key!r}: {slot} is given twice")
            given.add(slot)
            if not value:
                raise ValueError(f"--assume {key}=: the value is empty")
            if key.startswith(EXTRA_PREFIX):
                extra[name] = value
            elif name == "vendor":
                fields["vendor"] = value.lower()
            elif name == "capability":
                fields["capability"] = _parse_capability(value)
            elif name == "arch":
                fields["arch"] = value
            elif name == "name":
                fields["device_name"] = value
            elif name == "triton":
                fields["triton"] = _parse_bool(key, value)
            elif name == "interpret":
                fields["triton_interpret"] = _parse_bool(key, value)
            else:  # devices
                if not (value.isascii() and value.isdigit()):
                    raise ValueError(f"--assume {key}={value!r}: expected a number of devices (0, 1, 2, ...)")
                fields["device_count"] = int(value)
        if "vendor" not in fields:
            raise ValueError(f"--assume {text!r} names no vendor (vendor=cuda|rocm|xpu|cpu|...)")
        vendor = fields["vendor"]
        fields.setdefault("triton", vendor != "cpu")
        fields.setdefault("device_count", 0 if vendor == "cpu" else 1)
        fields.setdefault("triton_interpret", env_flag("TRITON_INTERPRET"))
        fields["extra"] = tuple(sorted(extra.items()))
        try:
            import torch

            fields["torch_version"] = torch.__version__
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        return cls(**fields)

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.extra).get(key, default)


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def _nvml_capability(index: int) -> tuple[tuple[int, int], str] | None:
    """Capability through NVML: no CUDA context is created. None when NVML is not usable."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            return (int(major), int(minor)), name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any NVML failure just means "ask torch instead"
        return None


def probe_platform(device: Any = None) -> PlatformInfo:
    """Describe the platform ``device`` lives on (default: the best accelerator here).

    Checks the vendor before any capability (ROCm builds of torch report capability tuples too),
    and avoids creating a CUDA context: NVML is asked first, torch only when NVML is missing.
    """
    import torch

    common: dict[str, Any] = {
        "torch_version": torch.__version__,
        "triton_interpret": env_flag("TRITON_INTERPRET"),
    }
    common["triton"] = triton_importable()
    dev_type = None
    index = 0
    if device is not None:
        dev = torch.device(device)
        dev_type = dev.type
        index = dev.index or 0
        if dev_type == "cpu":
            return PlatformInfo(vendor="cpu", **common)

    if getattr(torch.version, "hip", None) and dev_type in (None, "cuda"):
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(index)
            arch = getattr(props, "gcnArchName", None)
            return PlatformInfo(
                vendor="rocm",
                capability=(props.major, props.minor),
                arch=arch.split(":")[0] if arch else None,
                device_name=props.name,
                device_count=torch.cuda.device_count(),
                runtime_version=torch.version.hip,
                **common,
            )
    elif getattr(torch.version, "cuda", None) and dev_type in (None, "cuda"):
        if torch.cuda.is_available():
            nv = _nvml_capability(index)
            if nv is None:
                cap = torch.cuda.get_device_capability(index)
                name = torch.cuda.get_device_name(index)
            else:
                cap, name = nv
            return PlatformInfo(
                vendor="cuda",
                capability=(int(cap[0]), int(cap[1])),
                arch=f"sm_{cap[0]}{cap[1]}",
                device_name=name,
                device_count=torch.cuda.device_count(),
                runtime_version=torch.version.cuda,
                **common,
            )
    xpu = getattr(torch, "xpu", None)
    if dev_type in (None, "xpu") and xpu is not None and xpu.is_available():
        return PlatformInfo(
            vendor="xpu",
            device_name=xpu.get_device_name(index),
            device_count=xpu.device_count(),
            **common,
        )
    if dev_type not in (None, "cpu", "cuda", "xpu"):
        return PlatformInfo(vendor=dev_type, **common)
    return PlatformInfo(vendor="cpu", **common)


def builder_device(device: Any) -> torch.device:
    """``device`` as the torch.device a builder runs on (``cuda`` with its index), or a ``DeviceError``
    naming it where no build can run: not a device name torch knows, ``meta`` (no data), or a CUDA or XPU
    device this torch cannot reach (a CPU-only build, no device visible, an index past the last device).
    Checked up front: torch's own error for the last kind is an AssertionError from deep inside its lazy
    initialisation, which names neither the device nor what to do."""
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DeviceError(f"device {device!r} is not a torch device ({' '.join(str(exc).split())})") from None
    if device.type == "meta":
        raise DeviceError(
            f"device {str(device)!r} holds no data (meta tensors have shapes only), so a builder has nowhere "
            f"to write its outputs: use the engine's device (cpu, cuda, cuda:1, ...)"
        )
    if device.type in ("cuda", "xpu"):
        module = getattr(torch, device.type, None)
        count = module.device_count() if module is not None and module.is_available() else 0
        if count == 0:
            kind = device.type.upper()
            if device.type == "cuda" and not (torch.version.cuda or torch.version.hip):
                why = f"this torch ({torch.__version__}) was built without CUDA support"
            else:
                why = f"no {kind} device is visible to this process (or this torch was built without {kind} support)"
            raise DeviceError(f"device {str(device)!r}: {why}; build on 'cpu', or on a device this torch can reach")
        if device.index is not None and device.index >= count:
            raise DeviceError(
                f"device {str(device)!r}: there are {count} {device.type.upper()} device(s) here "
                f"(indices 0 to {count - 1})"
            )
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device
