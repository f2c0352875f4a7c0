"""``depthbench data sft``: instruction records as token ids and label masks, cached.

The records (:mod:`.records`) are shuffled with ``seed`` (then cut to
``max_samples``), as the original's ``prepare_commonsense170k.py`` does,
the first ``val_fraction`` of them held out, and each rendered and encoded
by the original's template and truncation rule (:mod:`.template`) with the
run's own tokenizer (the one tokenizer interface; EOS is the run's).  The
entry lives in the data cache (``<root>/sft/<key>/``; ``key``: a digest of
the records' bytes, the tokenizer's bytes and ids and every option, which a
fine-tuned run records as the data's digest) and is built aside and renamed
into place like every cache entry::

    manifest.json               source, tokenizer, template, counts, truncations
    {train,val}_ids.npy         the split's records' ids, concatenated
    {train,val}_mask.npy        their label masks, aligned (bool)
    {train,val}_offsets.npy     where each record starts, int64 [records + 1]

Re-running with the same inputs reuses the entry.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from depthbench.data import cache
from depthbench.digest import file_sha256
from depthbench.errors import ConfigError
from depthbench.finetune import template
from depthbench.finetune.records import read_records

WHAT = "data sft"
FORMAT = 1  # the entry's layout and the template's version
SPLITS = ("train", "val")
_CHUNK = 512  # records tokenised per call


@dataclasses.dataclass(frozen=True)
class SFTData:
    """A prepared entry: its directory and manifest; arrays read on demand."""

    directory: Path
    manifest: dict

    @property
    def digest(self) -> str:
        return self.manifest["digest"]

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, mask, offsets)`` of split ``name``, memory-mapped."""
        return tuple(np.load(self.directory / f"{name}_{part}.npy", mmap_mode="r")
                     for part in ("ids", "mask", "offsets"))

    def records(self, name: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each record of split ``name`` as ``(ids, label mask)``."""
        ids, mask, offsets = self.split(name)
        return [(np.asarray(ids[a:b]), np.asarray(mask[a:b]))
                for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def open_sft(directory: str | Path, field: str = "--data") -> SFTData:
    """A prepared entry (``data sft`` printed its directory); one line if it is not one."""
    path = Path(directory).expanduser()
    try:
        manifest = cache.read_json(path / "manifest.json")
    except (OSError, ValueError):
        raise ConfigError(f"{field}: {str(directory)!r} is not a directory `depthbench data sft` "
                          "wrote (no readable manifest.json)") from None
    if manifest.get("format") != FORMAT or manifest.get("kind") != "sft":
        raise ConfigError(f"{field}: {path} holds another kind of data ({manifest.get('kind')}, "
                          f"format {manifest.get('format')}); run `depthbench data sft` again")
    return SFTData(path.resolve(), manifest)


def _check(max_seq_len: int, max_samples: int | None, val_fraction: float) -> None:
    if max_seq_len < 2:
        raise ConfigError(f"--max-seq-len: {max_seq_len}; want at least 2 (one response token "
                          "and EOS)")
    if max_samples is not None and max_samples < 1:
        raise ConfigError(f"--max-samples: {max_samples}; want a positive count")
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"--val-fraction: {val_fraction}; want a share in (0, 1)")


def _split_sizes(n: int, val_fraction: float, where: Path, field: str) -> tuple[int, int]:
    n_val = max(1, round(n * val_fraction))
    if n - n_val < 1:
        raise ConfigError(f"{field}: {where} holds {n} record(s); holding out "
                          f"{n_val} for validation leaves none to train on")
    return n - n_val, n_val


def _encode(records, tok, max_seq_len: int, where: str, progress: bool, length_field: str):
    """``(ids, mask, offsets, truncated)`` of ``records`` (a list of (index, Record))."""
    from tqdm import tqdm

    ids, masks, lengths, truncated = [], [], [], 0
    with tqdm(total=len(records), desc=f"tokenising {where}", unit="record",
              disable=not progress) as bar:
        for start in range(0, len(records), _CHUNK):
            chunk = records[start:start + _CHUNK]
            prompts = tok.encode_batch([template.prompt(r) for _, r in chunk])
            answers = tok.encode_batch([template.response(r) for _, r in chunk])
            for (i, _), p, a in zip(chunk, prompts, answers, strict=True):
                x, m, cut = template.encode(p, a, tok.eos_id, max_seq_len, f"record {i}",
                                            length_field)
                ids.append(x)
                masks.append(m)
                lengths.append(len(x))
                truncated += cut
            bar.update(len(chunk))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    return np.concatenate(ids).astype(dtype), np.concatenate(masks), offsets, truncated


def prepare_sft(records_path: str | Path, run_dir: str | Path, *, max_seq_len: int = 512,
                max_samples: int | None = None, val_fraction: float = 0.02, seed: int = 42,
                cache_dir: str = "", progress: bool = True, field: str = "RECORDS",
                length_field: str = "--max-seq-len") -> SFTData:
    """The cache entry of ``records_path`` tokenised by ``run_dir``'s tokenizer (built
    if absent; ``field``, ``length_field``: what error lines call the records and
    ``max_seq_len``)."""
    from depthbench.run import open_run

    _check(max_seq_len, max_samples, val_fraction)
    source = Path(records_path).expanduser()
    if not source.is_file():
        raise ConfigError(f"{field}: {str(records_path)!r} is not a file")
    run = open_run(run_dir, WHAT)
    tok = run.tokenizer
    if tok.eos_id < 0:
        raise ConfigError(f"{WHAT}: the tokenizer of {run.path} has no EOS id, which ends "
                          "every response")
    options = {"max_seq_len": max_seq_len, "max_samples": max_samples,
               "val_fraction": val_fraction, "seed": seed}
    key = cache.digest("sft", FORMAT, file_sha256(source), tok.sha256, tok.eos_id,
                       tok.vocab_size, options)
    records = read_records(source, field)  # (bad records: one line before the cache is touched)
    order = np.random.default_rng(seed).permutation(len(records))[:max_samples]
    _, n_val = _split_sizes(len(order), val_fraction, source, field)
    split_of = {"val": order[:n_val], "train": order[n_val:]}
    root = cache.cache_root(cache_dir)
    final = root / "sft" / key
    with cache.exclusive(root):
        if (final / "manifest.json").is_file():
            return open_sft(final)
        manifest = {"kind": "sft", "format": FORMAT, "digest": key,
                    "source": str(source.resolve()), "source_sha256": file_sha256(source),
                    "records_in_file": len(records), "run": str(run.path),
                    "tokenizer": tok.record(), "template": "alpaca (prepare_commonsense170k.py)",
                    **options, "splits": {}}
        with cache.atomic_dir(final) as work:
            for name in SPLITS:
                chosen = [(int(i), records[i]) for i in split_of[name]]
                ids, mask, offsets, truncated = _encode(chosen, tok, max_seq_len, name, progress,
                                                        length_field)
                for part, array in (("ids", ids), ("mask", mask), ("offsets", offsets)):
                    np.save(work / f"{name}_{part}.npy", array)
                manifest["splits"][name] = {
                    "records": len(chosen), "tokens": int(len(ids)),
                    "supervised_tokens": int(mask.sum()), "truncated": int(truncated),
                    "longest": int(np.max(np.diff(offsets)))}
            cache.write_json(work / "manifest.json", manifest)
    return open_sft(final)
