"""What a run checks before it writes anything, in one place: ``train`` and every
dry run run the same checks, so a dry run refuses what the run would.  Each
is one :class:`~depthbench.errors.ConfigError`; nothing is written."""

from __future__ import annotations

from pathlib import Path

from depthbench import output_paths, parallel
from depthbench.data import cache
from depthbench.errors import ConfigError
from depthbench.rundir import lock
from depthbench.train import wandb_sink


def check_config(config) -> None:
    """The checks of one run's config against this host (its directory aside):
    the W&B mode and package, the data cache directory, the launch environment's
    process counts and ids."""
    wandb_sink.mode_of(config)
    root = cache.cache_root(config.data.cache_dir)
    cache.usable_dir(root, cache.cache_field(config.data.cache_dir))
    parallel.distributed_reason()
    parallel.distributed_args()


def check_run(config, workdir: str | Path) -> Path:
    """Every check of :func:`check_config` and of the run directory (not a URL, no
    link loop, not being trained by another process); returns it, resolved."""
    if "://" in str(workdir):
        raise ConfigError(f"--workdir: {str(workdir)!r} is a URL; runs write to a filesystem "
                          "path (shared by all hosts: NFS, Lustre, a gcsfuse mount of a bucket)")
    resolved = output_paths.resolve(workdir, "--workdir")
    check_config(config)
    if not parallel.env_process_index():  # process 0 claims it later (lock.training_claim)
        lock.check_unclaimed(resolved)
    return resolved
