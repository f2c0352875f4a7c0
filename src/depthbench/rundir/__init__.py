"""A run directory: what it holds and how every reader and writer opens it.

One module per job:

* :mod:`~depthbench.rundir.names`: the names of its files and directories
  (and of a sweep directory's);
* :mod:`~depthbench.rundir.io`: atomic JSON writes, JSON and JSON-lines
  reads with one torn-line rule, :class:`~depthbench.rundir.io.DamagedFile`;
* :mod:`~depthbench.rundir.lock`: the lock that lets one process train it;
* :mod:`~depthbench.run_identity`: the run's identity (the one list of
  runtime fields), whether a config may resume it, its saved config;
* :mod:`~depthbench.rundir.integrity`: sealing a checkpoint step, checking it;
* :mod:`~depthbench.rundir.restore`: the newest intact checkpoint (or the one
  asked for), for the trainer and every reader;
* :mod:`~depthbench.rundir.damage`: which records a report must not trust.

Train, analyze, eval, lm-eval, report, the sweep and the notebook (through
``load_run``) all open run directories through these modules.
"""
