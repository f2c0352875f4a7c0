"""The run directory an export reads: its config, its family, its newest intact
checkpoint's parameters, its tokenizer files.

Trained runs, imported runs and fine-tuned runs alike: the config is read
first (a directory that is not a run, or a family the format cannot hold, is
refused before a checkpoint is opened); the parameters come through
``load_run`` (the integrity-checked restore every reader uses) as host arrays
in the leaves' own dtypes.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path

import numpy as np

from depthbench.errors import ConfigError
from depthbench.importers.run_writer import TOKENIZER_FILES


@dataclasses.dataclass
class SourceRun:
    run_dir: Path
    config: object  # the run's ConfigDict
    resolved: dict  # config.json's "resolved" block
    command: str

    @cached_property
    def family(self):
        """The run's family instance (its model's spec)."""
        from depthbench.model.residual.protocol import registry
        from depthbench.model.spec import ModelSpec

        return registry.build(ModelSpec.from_config(self.config))

    @cached_property
    def loaded(self):
        from depthbench.run import load_run

        return load_run(self.run_dir)

    def params(self) -> dict:
        """The newest intact checkpoint's parameters as nested dicts of numpy arrays."""
        import jax

        return jax.tree.map(np.asarray, jax.device_get(self.loaded.params))

    def tokenizer_files(self) -> dict[str, Path]:
        """Name in an exported folder -> file: the Hugging Face tokenizer files the
        run directory carries (an imported run's), else the tokenizer the run
        was trained with (``resolved.tokenizer.tokenizer_path``)."""
        files = {name: self.run_dir / name for name in TOKENIZER_FILES
                 if (self.run_dir / name).is_file()}
        path = str((self.resolved.get("tokenizer") or {}).get("tokenizer_path") or "")
        if not files and path and Path(path).is_file():
            files = {"tokenizer.json" if path.endswith(".json") else "tokenizer.model": Path(path)}
        return files


def open_run(run_dir: str | Path, command: str) -> SourceRun:
    """The run directory ``run_dir`` (its config read, nothing restored yet)."""
    from depthbench.rundir.identity import saved_config
    from depthbench.rundir.io import read_json
    from depthbench.rundir.names import CONFIG_FILE

    path = Path(run_dir).expanduser()
    saved = read_json(path / CONFIG_FILE) if path.is_dir() else None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict) or (
            "family" not in saved["model"]):
        raise ConfigError(f"{command}: RUN_DIR {str(run_dir)!r} is not a run directory (no "
                          f"{CONFIG_FILE} naming model.family); give one written by train, "
                          "import-olmo or import-hf")
    resolved = saved.pop("resolved", {}) or {}
    return SourceRun(path.resolve(), saved_config(saved), resolved, command)
