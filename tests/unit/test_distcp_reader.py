"""The distributed-checkpoint reader trusts no pickle (formats/olmo: distcp, torch_save, unpickle).

A ``.metadata`` or a tensor archive that names anything outside torch's
checkpoint classes is one line naming it, exit 2, with nothing run and
nothing written; a tensor record that reaches past its storage is damage,
not a read out of bounds; chunks written by torch's own writer (as FSDP
ranks write them) are assembled whole.  Unit tests: in-process, small files.
"""

from __future__ import annotations

import io
import pickle
import shutil
import struct
import zipfile

import numpy as np
import original_outputs as original
import pytest

from depthbench.cli import main as cli_main
from depthbench.formats.olmo.distcp import DistCheckpoint
from depthbench.formats.olmo.torch_save import read_torch_save
from depthbench.formats.olmo.unpickle import Refused


def _runs_a_shell_command(marker) -> bytes:
    """A pickle whose loading calls ``os.system("touch MARKER")`` (the attack a hub
    checkpoint could carry), opcode by opcode: GLOBAL os.system, one argument, REDUCE."""
    command = f"touch {marker}".encode()
    return (b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(command)) + command
            + b"\x85R.")


def _copy_step(tmp_path, design="pre_ln"):
    step = tmp_path / "ckpt" / "step1"
    shutil.copytree(original.step_dir(design), step)
    return step


def _one_line(capsys, rc, *needles):
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), captured.err
    return lines[0]


def test_a_metadata_pickle_that_runs_a_command_runs_nothing(tmp_path, capsys):
    step = _copy_step(tmp_path)
    marker = tmp_path / "pwned"
    (step / "model_and_optim" / ".metadata").write_bytes(_runs_a_shell_command(marker))
    rc = cli_main(["import-olmo", str(step), "--out", str(tmp_path / "run"), "--no-progress"])
    _one_line(capsys, rc, ".metadata names os.system", "refused", "nothing in it was run")
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_an_index_naming_an_unknown_class_is_refused(tmp_path, capsys):
    """OLMo-core's writer pickles its ``_StorageInfo``; any other class of its (or of
    any module) is refused by name, before an object is built from it."""
    step = _copy_step(tmp_path)
    meta = step / "model_and_optim" / ".metadata"
    raw = meta.read_bytes()
    assert raw.count(b"_StorageInfo") == 1  # the writer's class, named once (memoised)
    meta.write_bytes(raw.replace(b"_StorageInfo", b"_StorageInfX"))
    rc = cli_main(["import-olmo", str(step), "--out", str(tmp_path / "run"), "--no-progress"])
    _one_line(capsys, rc, "olmo_core.distributed.checkpoint.filesystem._StorageInfX")
    assert not (tmp_path / "run").exists()


def _archive(data_pkl: bytes, storage: bytes = b"") -> bytes:
    """A torch.save-shaped zip: ``archive/data.pkl`` and one storage ``archive/data/0``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", storage)
    return buf.getvalue()


def _tensor_record(numel: int, offset: int, size: tuple, stride: tuple) -> bytes:
    """The pickle torch.save writes for a float32 tensor, opcode by opcode:
    ``_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())``."""
    def tup(values):
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"

    storage = (b"(X\x07\x00\x00\x00storage" + b"ctorch\nFloatStorage\n" + b"X\x01\x00\x00\x000"
               + b"X\x03\x00\x00\x00cpu" + b"J" + struct.pack("<i", numel) + b"tQ")
    return (b"\x80\x02" + b"ctorch._utils\n_rebuild_tensor_v2\n" + b"(" + storage
            + b"J" + struct.pack("<i", offset) + tup(size) + tup(stride) + b"\x89"
            + b"ccollections\nOrderedDict\n)R" + b"tR.")


def test_a_tensor_archive_is_rebuilt_and_checked_against_its_storage():
    values = np.arange(12, dtype=np.float32)
    view = read_torch_save(_archive(_tensor_record(12, 2, (2, 3), (3, 1)), values.tobytes()))
    np.testing.assert_array_equal(view, values[2:8].reshape(2, 3))
    assert not view.flags.writeable
    transposed = read_torch_save(_archive(_tensor_record(12, 0, (3, 4), (1, 3)),
                                          values.tobytes()))
    np.testing.assert_array_equal(transposed, values.reshape(4, 3).T)
    with pytest.raises(pickle.UnpicklingError, match="reaches element 13 of a storage of 12"):
        read_torch_save(_archive(_tensor_record(12, 6, (2, 4), (4, 1)), values.tobytes()))


def test_a_tensor_archive_that_names_code_is_refused():
    with pytest.raises(Refused) as e:
        read_torch_save(_archive(_runs_a_shell_command("/nonexistent/x")))
    assert e.value.what == "os.system"


def test_chunks_written_by_torchs_own_writer_are_assembled(tmp_path):
    """A tensor saved in two row chunks (as two FSDP ranks save it), the second a
    view into a larger storage, through torch's FileSystemWriter: read whole."""
    torch = pytest.importorskip("torch", reason="writes with torch's own writer")
    import dataclasses

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    rows = ((0, 3), (3, 4))

    class TwoRanks(DefaultSavePlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            items = [i for i in plan.items if i.index.fqn != "model.w"]
            w = self.state_dict["model.w"]
            props = next(i for i in plan.items if i.index.fqn == "model.w").tensor_data
            for start, n in rows:
                offsets = torch.Size([start, 0])
                chunk = ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([n, w.shape[1]]))
                items.append(WriteItem(index=MetadataIndex("model.w", offsets),
                                       type=WriteItemType.SHARD,
                                       tensor_data=TensorWriteData(chunk=chunk,
                                                                   properties=props.properties,
                                                                   size=w.size())))
            self.plan = dataclasses.replace(plan, items=items)
            return self.plan

        def resolve_data(self, item):
            if item.index.fqn != "model.w":
                return super().resolve_data(item)
            return self.state_dict["model.w"].narrow(0, item.index.offset[0],
                                                     item.tensor_data.chunk.sizes[0])

    w = torch.arange(28, dtype=torch.float32).reshape(7, 4)
    dcp.save({"model.w": w, "model.b": torch.ones(3, dtype=torch.bfloat16)},
             checkpoint_id=str(tmp_path), planner=TwoRanks(), no_dist=True)
    ckpt = DistCheckpoint(tmp_path)
    assert [c.offsets for c in ckpt.entries["model.w"][2]] == [(0, 0), (3, 0)]
    np.testing.assert_array_equal(ckpt.read("w"), w.numpy())
    assert str(ckpt.read("b").dtype) == "bfloat16" and ckpt.read("b").tolist() == [1.0] * 3
