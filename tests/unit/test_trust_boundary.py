"""The trust boundary (issue 48, docs/SECURITY.md): a checkpoint, a Hugging Face
folder or a run directory from someone else cannot make a reader read or copy
out a file of yours, allocate what it does not hold, load a tensor with a gap
or an overlap, or change the reader's own objects; each crafted input of
tests/helpers/bad_checkpoints.py is one line, exit 2, nothing written and
nothing copied.  The pieces each class rests on are tested with known answers
below the table.  Unit tests: in-process, small files (a sparse file or a
zip header declares sizes without holding them).
"""

from __future__ import annotations

import collections
import gc
import json
import os
import pickle
import re
import shutil
import stat
import sys
import warnings

import numpy as np
import pytest
from bad_checkpoints import (
    CASES,
    EMBED,
    GIB,
    SECRET,
    build_sources,
    original_tensors,
    reforge,
    sparse,
)

from depthbench import confine
from depthbench.cli import main as cli_main
from depthbench.cli import quiet_abandoned_work
from depthbench.errors import ConfigError
from depthbench.formats.olmo import distcp
from depthbench.formats.olmo.unpickle import Record, loads
from depthbench.rundir import io as rundir_io
from depthbench.rundir.integrity import check_integrity, write_integrity

pytest.importorskip("safetensors", reason="the Hugging Face source needs safetensors")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return build_sources(tmp_path_factory.mktemp("sources"))


def snapshot(root) -> dict:
    """Every path under ``root`` as it is, links not followed, nothing opened but
    small regular files (a sparse file by size and time, a FIFO as such)."""
    snap = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                snap[path] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                snap[path] = "dir"
            elif not stat.S_ISREG(info.st_mode):
                snap[path] = "special"
            elif info.st_size > 1 << 20:
                snap[path] = (info.st_size, info.st_mtime_ns)
            else:
                with open(path, "rb") as f:
                    snap[path] = f.read()
    return snap


def test_every_class_has_cases():
    kinds = collections.Counter(c.kind for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES)
    assert {k: n >= 4 for k, n in kinds.items()} == dict.fromkeys(
        ("confine", "bounds", "cover", "schema", "unpickle"), True), kinds


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case, sources, tmp_path, capsys):
    pristine = getattr(sources, case.source)
    src = tmp_path / "src" / pristine.name
    shutil.copytree(pristine, src, symlinks=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    case.damage(src, scratch)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = cli_main(case.argv(src, out))
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2 and len(lines) == 1, captured.err[-3000:]
    assert lines[0].startswith("depthbench: error: ") and re.search(case.pattern, lines[0]), \
        lines[0]
    assert SECRET not in captured.out + captured.err
    assert snapshot(tmp_path) == before and not out.exists()  # nothing written, nothing copied


# ------------------------------------------------------- exact coverage, known answers


def _chunks(*boxes):
    return [distcp._Chunk(tuple(o), tuple(s), "f", 0, 0) for o, s in boxes]


@pytest.mark.parametrize("boxes,why", [
    ([((0, 0), (4, 3))], None),
    ([((0, 0), (2, 3)), ((2, 0), (2, 3))], None),  # rows
    ([((0, 0), (4, 1)), ((0, 1), (4, 2))], None),  # columns
    ([((0, 0), (2, 2)), ((2, 0), (2, 2)), ((0, 2), (4, 1))], None),  # a grid, unevenly
    ([((0, 0), (2, 3)), ((0, 0), (2, 3))], "its chunks at (0, 0) and (0, 0) overlap"),
    ([((0, 0), (3, 3)), ((2, 0), (2, 3))], "its chunks at (0, 0) and (2, 0) overlap"),
    ([((0, 0), (2, 3)), ((3, 0), (1, 3))], "its chunks cover 9 of its 12 elements"),
    ([((0, 0), (2, 2)), ((2, 0), (2, 2)), ((0, 1), (4, 2))],
     "its chunks at (0, 0) and (0, 1) overlap"),  # the sizes add up to 14, not 12
    ([((3, 0), (2, 3))], "the chunk at (3, 0) of (2, 3) reaches past its shape (4, 3)"),
    ([((0,), (12,))], "the chunk at (0,) has 1 dimensions, the tensor 2"),
])
def test_a_split_tensor_is_covered_exactly_once(boxes, why):
    assert distcp.cover_problem((4, 3), _chunks(*boxes)) == why


def test_many_chunks_are_checked_pairwise():
    rows = [((i, 0), (1, 3)) for i in range(600)]
    assert distcp.cover_problem((600, 3), _chunks(*rows)) is None
    rows[599] = ((300, 0), (1, 3))  # one row twice, another never
    assert distcp.cover_problem((600, 3), _chunks(*rows)) == (
        "its chunks at (300, 0) and (300, 0) overlap")


def test_a_tensor_split_in_two_halves_reads_whole(sources, tmp_path):
    """The forger writes what the reader reads: the original's embedding split in
    two row chunks (as two FSDP ranks save it) reads back equal, and imports."""
    step = tmp_path / "step1"
    shutil.copytree(sources.olmo, step)
    reforge(step, split={EMBED: [((0, 0), (50, 48)), ((50, 0), (78, 48))]})
    ckpt = distcp.DistCheckpoint(step / "model_and_optim")
    assert [c.offsets for c in ckpt.entries[EMBED].chunks] == [(0, 0), (50, 0)]
    np.testing.assert_array_equal(ckpt.read("embeddings.weight"), original_tensors()[EMBED])
    assert cli_main(["import-olmo", str(step), "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0


# ---------------------------------------------------------------- the unpickler


def test_a_refused_build_leaves_the_stand_ins_as_they_were():
    dtype = distcp.INDEX_CLASSES[("torch", "float32")]
    size = distcp.INDEX_CLASSES[("torch", "Size")]
    chunk = distcp.INDEX_CLASSES[(distcp._METADATA, "ChunkStorageMetadata")]
    attempts = {  # GLOBAL x; state; BUILD
        dtype: b"torch\nfloat32\n" + pickle.dumps((None, {"name": "float64"}), 2)[2:-1],
        size: b"torch\nSize\n" + pickle.dumps((None, {"fn": 1}), 2)[2:-1],
        chunk: (b"torch.distributed.checkpoint.metadata\nChunkStorageMetadata\n"
                + pickle.dumps({"fields": {}}, 2)[2:-1]),
    }
    for opcodes in attempts.values():
        with pytest.raises(pickle.UnpicklingError, match="the pickle tries to change"):
            loads(b"\x80\x02c" + opcodes + b"b.", distcp.INDEX_CLASSES)
    assert dtype.name == "float32" and size.fn.__name__ == "int_tuple"
    assert set(chunk.fields) == {"offsets", "sizes"} and chunk.kind == "ChunkStorageMetadata"
    with pytest.raises(AttributeError):
        dtype.name = "float64"
    assert dtype.name == "float32"


def test_a_record_takes_only_its_validated_fields():
    info = distcp._STORAGE_INFO
    built = loads(b"\x80\x02ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n)\x81"
                  + pickle.dumps({"relative_path": "__0_0.distcp", "offset": 3, "length": 9},
                                 2)[2:-1] + b"b.", distcp.INDEX_CLASSES)
    assert isinstance(built, info) and (built.relative_path, built.offset, built.length) == (
        "__0_0.distcp", 3, 9) and built.transform_descriptors is None
    for state, why in (({"offset": -1}, "a byte count is -1"),
                       ({"relative_path": 7}, "a data file name is a int"),
                       ({"__class__": "x"}, "_StorageInfo has no field '__class__'"),
                       ({"kind": "x"}, "_StorageInfo has no field 'kind'")):
        with pytest.raises(pickle.UnpicklingError, match=re.escape(why)):
            loads(b"\x80\x02ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n)\x81"
                  + pickle.dumps(state, 2)[2:-1] + b"b.", distcp.INDEX_CLASSES)
    assert issubclass(info, Record) and info.kind == "_StorageInfo"


def test_a_pickle_is_bounded_in_opcodes():
    assert loads(b"\x80\x04]" + b"}a" * 10 + b".", {}, max_ops=30) == [{}] * 10
    with pytest.raises(pickle.UnpicklingError, match="more than 20 opcodes"):
        loads(b"\x80\x04]" + b"}a" * 10 + b".", {}, max_ops=20)


# ---------------------------------------------------------- confinement, bounds


def test_confine_reads_and_copies_only_regular_files_within_their_limit(tmp_path):
    (tmp_path / "secret").write_text(SECRET)
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.json").write_text("{}")
    (root / "link").symlink_to(tmp_path / "secret")
    os.mkfifo(root / "fifo")
    assert confine.read_bytes(root / "ok.json", 2, "f") == b"{}"
    with pytest.raises(ConfigError, match=r"^f: \S+/ok\.json holds 2 bytes; at most 1 are read$"):
        confine.read_bytes(root / "ok.json", 1, "f")
    for name, why in (("link", "is a symbolic link"), ("fifo", "is not a regular file")):
        with pytest.raises(ConfigError, match=why):
            confine.copy_file(root / name, tmp_path / f"copy_{name}", 1 << 20, "f")
        assert not (tmp_path / f"copy_{name}").exists()
    confine.copy_file(root / "ok.json", tmp_path / "copy", 2, "f")
    assert (tmp_path / "copy").read_text() == "{}"
    for name in ("../secret", "/etc/passwd", "a/../../secret", "link"):
        with pytest.raises(ConfigError, match="is not a path inside|is a symbolic link"):
            confine.member(root, name, "f")


def test_json_is_read_with_a_size_cap_and_a_nesting_limit(tmp_path):
    inner = rundir_io.loads("[" * 64 + "]" * 64, "x")  # 64 levels: read
    for _ in range(63):
        inner = inner[0]
    assert inner == []
    for text in ("[" * 65 + "]" * 65, "[" * 100_000):
        with pytest.raises(rundir_io.DamagedFile, match="nests deeper than 64 levels"):
            rundir_io.loads(text, "x")
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"a": "x" * 100}))
    assert rundir_io.read_json(path)["a"] == "x" * 100
    with pytest.raises(rundir_io.DamagedFile,
                       match=r"big\.json: holds 109 bytes; at most 100 are read$"):
        rundir_io.read_json(path, limit=100)
    sparse(path, GIB)
    with pytest.raises(rundir_io.DamagedFile, match="holds 1,073,741,824 bytes"):
        rundir_io.read_json(path)
    log = tmp_path / "metrics.jsonl"  # a log: 1 GiB read, more refused before it is read
    log.write_text('{"step": 1}\n{"step": 2}\n')
    assert [r["step"] for r in rundir_io.read_jsonl(log)] == [1, 2]
    sparse(log, 2 * GIB)
    with pytest.raises(rundir_io.DamagedFile, match=r"metrics\.jsonl: holds 2,147,483,648 bytes; "
                       r"at most 1,073,741,824 are read$"):
        rundir_io.read_jsonl(log)


def test_integrity_records_are_checked_field_by_field(tmp_path):
    step = tmp_path / "7"
    step.mkdir()
    (step / "a").write_text("x")
    write_integrity(step)
    assert check_integrity(step) is None
    record = json.loads((step / "integrity.json").read_text())
    for files, why in (([], "files must be an object"),
                       ({"a": [1]}, "files['a'] must be [size, sha256]"),
                       ({"a": [True, "0" * 64]}, "files['a'] must be [size, sha256]"),
                       ({"/etc/passwd": [1, "0" * 64]}, "names '/etc/passwd', which is not a "
                        "path inside the step")):
        (step / "integrity.json").write_text(json.dumps({"files": files}))
        assert why in check_integrity(step)
    (step / "integrity.json").write_text(json.dumps(record))
    (step / "b").symlink_to(tmp_path / "elsewhere")
    assert check_integrity(step) == "b is a symbolic link"


def test_abandoned_writes_say_nothing_after_the_error_line(monkeypatch):
    """A save stopped by a full disk leaves coroutines never awaited: after the
    one error line they are collected silently; other warnings still show."""
    async def write_fragment():
        return None

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_fragment()  # never awaited: collected at once
        assert [str(w.message) for w in caught] == [
            f"coroutine '{write_fragment.__qualname__}' was never awaited"]
        quiet_abandoned_work()
        write_fragment()
        warnings.warn("still shown", RuntimeWarning, stacklevel=1)
        gc.collect()
    assert [str(w.message) for w in caught][1:] == ["still shown"]
    assert sys.unraisablehook(None) is None  # dropped: would raise on None otherwise
