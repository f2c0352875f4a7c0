"""``depthbench data sft``: the original's template, label mask and truncation, cached.

Known answers: the prompt text of the original's ``prepare_commonsense170k.py``
(format_instruction_prompt, both forms, copied here as it reads); a record's
ids are the prompt's, the response's and EOS, the mask covers exactly the
response and EOS; a long record keeps ``max_seq_len - 1`` tokens and EOS;
JSON, JSON lines and Parquet give the same arrays; the entry is reused; JSON
lines end at \\n only; a refused record leaves the cache untouched; a damaged
entry is refused in one line by open_sft and rebuilt by prepare_sft.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_tiny import tiny_run

from depthbench.errors import ConfigError
from depthbench.finetune import records as template
from depthbench.finetune.records import Record, open_sft, prepare_sft, read_records

RECORDS = [{"instruction": f"  Add {i} and {i + 1}. ", "input": "" if i % 3 else f"n = {i}\n",
            "output": f" {2 * i + 1}\n", "answer": str(2 * i + 1)} for i in range(12)]


def test_the_prompt_is_the_originals():
    assert template.prompt(Record(" Say hi. ", "", "hi")) == (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:\n")
    assert template.prompt(Record("Sum.", " 1 2 ", "3")) == (
        "Below is an instruction that describes a task, paired with an input that provides "
        "further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nSum.\n\n### Input:\n1 2\n\n### Response:\n")


def test_the_mask_covers_the_response_and_eos_and_long_records_keep_eos():
    ids, mask, cut = template.encode([5, 6, 7], [8, 9], 0, 16, "r")
    assert ids.tolist() == [5, 6, 7, 8, 9, 0] and mask.tolist() == [0, 0, 0, 1, 1, 1]
    assert not cut
    ids, mask, cut = template.encode([5, 6, 7], [8, 9, 10, 11], 0, 5, "r")
    assert ids.tolist() == [5, 6, 7, 8, 0] and mask.tolist() == [0, 0, 0, 1, 1] and cut
    with pytest.raises(ConfigError, match=r"^--max-seq-len 3: r's prompt alone is 3 tokens"):
        template.encode([5, 6, 7], [8], 0, 3, "r")


@pytest.fixture(scope="module")
def run_and_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    run = tiny_run(root / "run")
    (root / "r.json").write_text(json.dumps(RECORDS))
    (root / "r.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(RECORDS), root / "r.parquet")
    return root, run


def test_every_format_gives_the_same_records_and_arrays(run_and_files, tmp_path):
    root, run = run_and_files
    assert read_records(root / "r.json") == read_records(root / "r.jsonl") == read_records(
        root / "r.parquet")
    entries = [prepare_sft(root / f"r.{ext}", run, max_seq_len=512, val_fraction=0.25,
                           cache_dir=str(tmp_path), progress=False)
               for ext in ("json", "jsonl", "parquet")]
    assert len({e.digest for e in entries}) == 3  # the file's bytes are part of the key
    for name in ("train", "val"):
        first = entries[0].split(name)
        for other in entries[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(first, other.split(name),
                                                            strict=True))
    assert entries[0].manifest["splits"]["val"]["records"] == 3


def test_a_record_decodes_to_the_template_and_its_mask_to_the_response(run_and_files, tmp_path):
    root, run = run_and_files
    from depthbench.run import open_run

    data = prepare_sft(root / "r.json", run, max_seq_len=512, cache_dir=str(tmp_path),
                       progress=False)
    tok = open_run(run, "test").tokenizer
    order = np.random.default_rng(42).permutation(len(RECORDS))  # the original's shuffle
    records = data.records("train")
    assert len(records) + len(data.records("val")) == len(RECORDS)
    for k, (ids, mask) in enumerate(records):
        record = read_records(root / "r.json")[order[1 + k]]  # val holds the first one
        text = template.prompt(record) + template.response(record)
        assert tok.decode(ids[:-1].tolist()) == text and ids[-1] == tok.eos_id
        assert tok.decode(ids[mask][:-1].tolist()) == template.response(record)
    again = prepare_sft(root / "r.json", run, max_seq_len=512, cache_dir=str(tmp_path),
                        progress=False)
    assert again.directory == data.directory and open_sft(data.directory).digest == data.digest


def test_json_lines_end_at_newlines_only(tmp_path):
    """U+2028 and U+2029 raw inside strings (json.dumps with ensure_ascii=False) are
    text: the records keep them, and a bad record is named by its real line; NaN,
    which Python's json writes, is not JSON."""
    rows = [{"instruction": "a\u2028b", "output": "c\u2029d"}, {"instruction": "e", "output": "f"}]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    assert read_records(path) == [Record("a\u2028b", "", "c\u2029d"), Record("e", "", "f")]
    path.write_text(path.read_text(encoding="utf-8") + '{"instruction": "g"}\n',
                    encoding="utf-8")
    with pytest.raises(ConfigError, match=r"r\.jsonl record 2 \(line 3\) has no 'output'"):
        read_records(path)
    (tmp_path / "n.json").write_text('[{"instruction": "a",\n  "output": NaN}]\n')
    with pytest.raises(ConfigError, match=r"^RECORDS: \S+/n\.json is not JSON \(NaN is not a "
                                          r"JSON value\)$"):  # JSON has no NaN
        read_records(tmp_path / "n.json")


def test_a_refused_record_leaves_the_cache_untouched(run_and_files, tmp_path):
    root, run = run_and_files
    with pytest.raises(ConfigError, match=r"^--max-seq-len 4: record \d+'s prompt alone"):
        prepare_sft(root / "r.json", run, max_seq_len=4, cache_dir=str(tmp_path / "cache"),
                    progress=False)
    assert not (tmp_path / "cache").exists()  # no sft/, no .lock


@pytest.mark.parametrize("damage", ["truncated ids", "offsets cut short", "no manifest"])
def test_a_damaged_entry_is_refused_by_open_and_rebuilt_by_prepare(run_and_files, tmp_path,
                                                                   damage, capsys):
    root, run = run_and_files
    data = prepare_sft(root / "r.json", run, cache_dir=str(tmp_path), progress=False)
    whole = {n: [np.array(a) for a in data.split(n)] for n in ("train", "val")}  # copies
    victim = {"truncated ids": "train_ids.npy", "offsets cut short": "val_offsets.npy",
              "no manifest": "manifest.json"}[damage]
    raw = (data.directory / victim).read_bytes()
    (data.directory / victim).write_bytes(raw[:40] if damage != "offsets cut short" else
                                          raw[:-8])
    with pytest.raises(ConfigError, match=r"^--data: '\S+' is not a whole `depthbench data sft` "
                                          r"entry \(.+\); run `depthbench data sft` again$"):
        open_sft(data.directory)
    capsys.readouterr()
    again = prepare_sft(root / "r.json", run, cache_dir=str(tmp_path), progress=False)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"depthbench: warning: the cache entry {data.directory} is damaged (") and err[0].endswith(
        "); rebuilding it")
    assert again.directory == data.directory and again.manifest == data.manifest
    for name, arrays in whole.items():
        assert all(np.array_equal(a, b) for a, b in zip(arrays, again.split(name), strict=True))
