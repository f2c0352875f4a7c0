"""Which library runs XLA:CPU's dots: chosen per CPU vendor by measurement, overridable.

``$DEPTHBENCH_CPU_DOTS`` (``auto``, ``eigen``, ``ynnpack``) becomes an
``XLA_FLAGS`` entry, added by the command entry points before jax starts
(:func:`apply_or_exit`); a flag already in ``XLA_FLAGS`` wins.  The choices
and what each measured: docs/CPU.md."""

from __future__ import annotations

import os
import platform
import sys

from depthbench.errors import EXIT_BAD_INPUT, ConfigError

ENV = "DEPTHBENCH_CPU_DOTS"
CHOICES = ("auto", "eigen", "ynnpack")
FLAG = "xla_cpu_experimental_ynn_fusion_type"
EIGEN_FLAGS = f"--{FLAG}=reduce"
# The faster library per vendor, each from python -m bench.cpu_dots on such a machine
# (bench/results/cpu_dots.md); a vendor not listed keeps XLA's default.
FASTER = {"AuthenticAMD": "eigen", "GenuineIntel": "ynnpack"}


def cpu_vendor() -> str:
    """``vendor_id`` of ``/proc/cpuinfo`` (``unknown`` where there is none)."""
    return _cpuinfo("vendor_id") or "unknown"


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown"


def _cpuinfo(key: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def setting() -> str:
    """``$DEPTHBENCH_CPU_DOTS`` (``auto`` when unset); a bad value is a ConfigError."""
    value = os.environ.get(ENV, "auto").strip() or "auto"
    if value not in CHOICES:
        raise ConfigError(f"${ENV}: {value!r} is not one of {', '.join(CHOICES)}")
    return value


def choice() -> str:
    """``eigen`` or ``ynnpack``: what :func:`setting` means on this CPU."""
    value = setting()
    return FASTER.get(cpu_vendor(), "ynnpack") if value == "auto" else value


def describe(library: str) -> str:
    return {"eigen": f"dots on Eigen ({EIGEN_FLAGS})",
            "ynnpack": "dots on YNNPACK (XLA's default)"}[library]


def apply() -> str:
    """Add the chosen flag to ``XLA_FLAGS`` (unless they set it already); returns
    what the processes' dots now run on, in words."""
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG in flags:
        return f"as XLA_FLAGS sets ({FLAG})"
    library = choice()
    if library == "eigen":
        os.environ["XLA_FLAGS"] = f"{flags} {EIGEN_FLAGS}".strip()
    return describe(library)


def apply_or_exit(prog: str) -> str:
    """:func:`apply` for a command's first lines: a bad ``$DEPTHBENCH_CPU_DOTS``
    is one line on stderr and exit status 2, like every bad input."""
    try:
        return apply()
    except ConfigError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(EXIT_BAD_INPUT) from None
