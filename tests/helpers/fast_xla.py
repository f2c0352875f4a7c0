"""XLA flags for every process of the test suite: compile fast, compute the same.

The CPU suite is dominated by XLA compiling many tiny programs, not by running
them, so the test session (tests/conftest.py) and every process it starts
compile with XLA's backend (LLVM) optimisation off and its classic loop
emitters.  That changes how fast the generated code runs, not what it
computes: the programs, their shardings and dtypes and the HLO the tests
inspect (cost and memory analyses) are the same,
and an equivalence or bitwise-resume test compares programs compiled with the
same flags, in this process or in a subprocess given :func:`subprocess_flags`.
"""

from __future__ import annotations

# XLA's CPU "fusion emitters" (the MLIR code generator for fused loops) take
# about half of the compile time of a tiny model's programs; the classic
# emitters compile the same HLO about twice as fast.  XLA also splits each
# program's LLVM module into parts compiled on parallel threads: for the
# suite's tiny programs, on two cores shared by two workers, the split costs
# about a fifth of the compile time and buys nothing; one part
# (bench/results/wall_times.md).
FAST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")


def with_fast_flags(flags: str) -> str:
    """``flags`` with the fast-compile flags appended, unless an optimisation level is set."""
    if "xla_backend_optimization_level" in flags:
        return flags.strip()
    return f"{flags} {FAST_XLA_FLAGS}".strip()


def subprocess_flags(devices: int | None = None) -> str:
    """``XLA_FLAGS`` for a test's subprocess: the fast-compile flags, and a fake CPU
    device count when ``devices`` is given (none: one device, like the test process)."""
    count = f"--xla_force_host_platform_device_count={devices}" if devices else ""
    return with_fast_flags(count)
