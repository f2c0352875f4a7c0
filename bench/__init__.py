"""depthbench's benchmarks: ``python -m bench`` runs them all (README, Performance).

Run as ``python -m bench`` or ``python -m bench.<module>``, the package first
applies the ``depthbench`` command's host-memory setting
(:mod:`depthbench.hostmem`, opt-in with ``DEPTHBENCH_MALLOC=keep``), before
numpy or jax start a thread (later it only partly takes), so steps are timed
as the command runs them; every table's header says what was decided.
Imported any other way (the tests), the package leaves the process alone.
"""

import sys

if sys.argv[:1] == ["-m"]:  # Python's placeholder while `-m` imports the package
    from depthbench import hostmem

    hostmem.keep_freed_memory_or_exit("bench")
