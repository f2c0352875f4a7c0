"""depthbench's benchmarks: ``python -m bench`` runs them all (README, Performance).

Run as ``python -m bench`` or ``python -m bench.<module>``, the package first
applies the ``depthbench`` command's host-memory setting
(:mod:`depthbench.hostmem`, ``$DEPTHBENCH_MALLOC``: glibc by default; with
``DEPTHBENCH_MALLOC=mimalloc`` it re-executes itself once with the mimalloc
allocator), before numpy or jax start a thread, so steps are timed as the
command runs them; every table's header says what was decided.  Imported
any other way (the tests), the package leaves the process alone.
"""

import sys

if sys.argv[:1] == ["-m"]:  # Python's placeholder while `-m` imports the package
    from depthbench import cpu_dots, hostmem

    hostmem.apply_or_exit("bench")
    cpu_dots.apply_or_exit("bench")
