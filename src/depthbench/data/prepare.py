"""``prepare``: corpus -> split -> tokenizer -> tokenised splits, each step cached
under :func:`depthbench.data.cache.cache_root` (the layout: docs/DATA.md,
"Tokenised cache").  A re-run finds everything and returns at once, without
reading the corpus."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tqdm.auto import tqdm

from depthbench.data import cache, corpora, pipeline, readers, split, token_cache
from depthbench.data import spm_tokenizer as tok
from depthbench.data.tokenize_inputs import PREFLIGHT_BYTES
from depthbench.data.tokenizer import Tokenizer, open_tokenizer
from depthbench.data.validate import validate_config
from depthbench.errors import ConfigError

# Bump when the tokenised layout changes: the cache key includes it.
TOKENS_VERSION = 1
_ENCODE_CHUNK = 512  # documents per SentencePiece batch call
_BPT_SAMPLE_TOKENS = 1 << 20  # tokens decoded to estimate bytes/token of token shards


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Where a prepared corpus lives and what it holds (saved into each run's config.json)."""

    corpus: str
    corpus_fingerprint: str
    tokenizer_path: str  # "" for token shards given without a tokenizer
    train_tokens_path: str
    val_tokens_path: str
    vocab_size: int
    bos_id: int  # -1: none
    eos_id: int
    pad_id: int  # -1: none
    train_tokens: int
    val_tokens: int
    train_documents: int
    val_documents: int
    train_bytes: int  # UTF-8 bytes of the training documents (0: unknown)
    val_bytes: int
    bytes_per_token: float  # training bytes per non-EOS token (0.0: unknown)
    token_dtype: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _logger(progress: bool):
    def log(message: str) -> None:
        if progress:
            print(message, file=sys.stderr, flush=True)

    return log


class _Ids(NamedTuple):
    tokenizer_path: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int


def check_inputs(config) -> None:
    """What :func:`prepare` checks before it reads the corpus through, writing and
    fetching nothing (a dry run's data check): the data fields and files, a given
    tokenizer, token shards' headers and the first
    :data:`~depthbench.data.tokenize_inputs.PREFLIGHT_BYTES` of each text or
    JSON-lines file.  What needs the whole corpus only :func:`prepare` finds."""
    validate_config(config)
    _given_tokenizer(config)
    d = config.data
    if d.corpus == "micro":
        return  # fetched and checked by prepare
    files = corpora.resolve_paths(d.paths)
    if d.corpus == "tokens":
        corpora.TokenShards(files, d.tokens_dtype, int(d.eos_id))
    for path in files if d.corpus in ("text", "jsonl") else ():
        if d.corpus == "text":
            readers.read_text(path, limit=PREFLIGHT_BYTES)
        else:
            for _ in readers.jsonl_documents(path, d.text_field, stop=PREFLIGHT_BYTES):
                pass


def _given_tokenizer(config) -> Tokenizer | None:
    """``data.tokenizer`` opened (None when the tokenizer is to be trained), its
    vocabulary checked against the model's."""
    d = config.data
    if not d.tokenizer:
        return None
    given = open_tokenizer(Path(d.tokenizer).expanduser(), field="config.data.tokenizer",
                           eos_id=int(d.eos_id))
    if given.vocab_size > config.model.vocab_size:
        raise ConfigError(
            f"config.data.tokenizer: {given.path} has {given.vocab_size} pieces but "
            f"model.vocab_size is {config.model.vocab_size}; set model.vocab_size >= "
            f"{given.vocab_size}"
        )
    return given


def prepare(config, *, progress: bool = True) -> Prepared:
    """Fetch, split, train the tokenizer and tokenise, reusing every cached step."""
    validate_config(config)
    log = _logger(progress)
    d = config.data
    root = cache.usable_dir(cache.cache_root(d.cache_dir), cache.cache_field(d.cache_dir))
    given = _given_tokenizer(config)
    eos_id = d.eos_id if d.eos_id >= 0 else (given.eos_id if given is not None else -1)
    t0 = time.perf_counter()
    with cache.exclusive(root):
        corpus = corpora.from_config(config, root, eos_id=eos_id, log=log)
        if corpus.kind == "text":
            entry, ids = _prepare_text(config, corpus, given, root, log, progress)
        else:
            entry, ids = _prepare_shards(config, corpus, given, root, log, progress)
    meta = _cached_meta(entry)
    prepared = Prepared(
        corpus=corpus.name,
        corpus_fingerprint=corpus.fingerprint(),
        tokenizer_path=ids.tokenizer_path,
        train_tokens_path=str(entry / "train.npy"),
        val_tokens_path=str(entry / "val.npy"),
        vocab_size=ids.vocab_size,
        bos_id=ids.bos_id,
        eos_id=ids.eos_id,
        pad_id=ids.pad_id,
        train_tokens=meta["train_tokens"],
        val_tokens=meta["val_tokens"],
        train_documents=meta["train_documents"],
        val_documents=meta["val_documents"],
        train_bytes=meta["train_bytes"],
        val_bytes=meta["val_bytes"],
        bytes_per_token=meta["bytes_per_token"],
        token_dtype=meta["token_dtype"],
    )
    pipeline.check_windows(config, prepared)
    if time.perf_counter() - t0 > 1.0:
        log(
            f"prepared {prepared.train_tokens + prepared.val_tokens} tokens in {entry} "
            f"({time.perf_counter() - t0:.1f}s)"
        )
    return prepared


def _prepare_text(config, corpus, given, root: Path, log, progress: bool) -> tuple[Path, _Ids]:
    d = config.data
    tk = given or _trained_tokenizer(config, corpus, root, log, progress)
    eos_id = d.eos_id if d.eos_id >= 0 else tk.eos_id
    if eos_id < 0:
        raise ConfigError(f"config.data.eos_id: {tk.path} has no EOS piece; set data.eos_id")
    key = cache.digest(
        "text-tokens",
        TOKENS_VERSION,
        corpus.fingerprint(),
        d.val_fraction,
        tk.sha256[:16],
        eos_id,
    )
    entry = root / "tokens" / key
    if not (entry / "meta.json").is_file():
        log(f"tokenising {corpus.describe()} with {tk.describe()}")
        with cache.atomic_dir(entry) as tmp:
            meta = _tokenise_text(corpus, tk, eos_id, d.val_fraction, tmp, progress)
            cache.write_json(tmp / "meta.json", meta)
    return entry, _Ids(tk.path, tk.vocab_size, tk.bos_id, eos_id, tk.pad_id)


def _prepare_shards(config, corpus, given, root: Path, log, progress: bool) -> tuple[Path, _Ids]:
    d = config.data
    key = cache.digest(
        "shard-tokens",
        TOKENS_VERSION,
        corpus.fingerprint(),
        d.val_fraction,
        corpus.eos_id,
        given.sha256[:16] if given else "",
    )
    entry = root / "tokens" / key
    limit = given.vocab_size if given is not None else config.model.vocab_size
    cached = (entry / "meta.json").is_file()
    # From meta.json when cached (model.vocab_size may differ between runs on one entry).
    max_id = cache.read_json(entry / "meta.json")["max_id"] if cached else corpus.max_id()
    if max_id >= limit:
        what = f"{given.path}'s {limit} pieces" if given else f"model.vocab_size {limit}"
        raise ConfigError(f"config.data.paths: the shards hold token id {max_id}, not below {what}")
    if not cached:
        log(f"splitting {corpus.describe()}")
        with cache.atomic_dir(entry) as tmp:
            meta = _split_shards(corpus, max_id, d.val_fraction, tmp, progress, given)
            cache.write_json(tmp / "meta.json", meta)
    if given is None:
        return entry, _Ids("", config.model.vocab_size, -1, corpus.eos_id, -1)
    return entry, _Ids(given.path, given.vocab_size, given.bos_id, corpus.eos_id, given.pad_id)


def _cached_meta(entry: Path) -> dict:
    """The entry's counts, after checking its arrays still match them (cheap: headers only)."""
    meta = cache.read_json(entry / "meta.json")
    for name in ("train", "val"):
        try:
            n = len(token_cache.open_tokens(entry / f"{name}.npy", field="data.cache_dir"))
        except ConfigError as e:
            raise ConfigError(f"{e}; delete {entry} to rebuild it") from None
        if n != meta[f"{name}_tokens"]:
            raise ConfigError(
                f"config.data.cache_dir: {entry / f'{name}.npy'} holds {n} tokens, its meta.json "
                f"says {meta[f'{name}_tokens']}; delete {entry} to rebuild it"
            )
    return meta


def tokenizer(prepared: Prepared) -> Tokenizer:
    """The prepared corpus's tokenizer (``encode(str)``, ``decode(ids)``)."""
    if not prepared.tokenizer_path:
        raise ConfigError(
            "config.data.tokenizer: these token shards were given no tokenizer; "
            "set data.tokenizer to their tokenizer (a tokenizer.json or a SentencePiece .model) "
            "to decode them"
        )
    return open_tokenizer(prepared.tokenizer_path, field="config.data.tokenizer",
                          eos_id=prepared.eos_id, bos_id=prepared.bos_id)


def _split_docs(corpus, fraction: float, want_val: bool) -> Iterator[str]:
    return (doc for doc in corpus.documents() if split.is_validation(doc, fraction) == want_val)


def _trained_tokenizer(config, corpus, root: Path, log, progress: bool) -> Tokenizer:
    d = config.data
    key = cache.digest(
        "spm",
        tok.TRAINER_VERSION,
        corpus.fingerprint(),
        d.val_fraction,
        config.model.vocab_size,
        d.tokenizer_sample_bytes,
    )
    path = root / "tokenizers" / key / "spm.model"
    if path.is_file():
        return tok.SentencePieceTokenizer(path)
    counts = {True: [0, 0], False: [0, 0]}  # is_val -> [documents, bytes]
    bar = tqdm(desc="scanning corpus", unit=" doc", disable=not progress, leave=False)
    for doc in corpus.documents():
        c = counts[split.is_validation(doc, d.val_fraction)]
        c[0] += 1
        c[1] += len(doc.encode("utf-8"))
        bar.update(1)
    bar.refresh()  # a fast scan ends inside tqdm's refresh interval: show the true count
    bar.close()
    _check_split(counts[False][0], counts[True][0], d.val_fraction)
    probability = min(1.0, d.tokenizer_sample_bytes / max(1, counts[False][1]))
    sample = (
        doc
        for doc in _split_docs(corpus, d.val_fraction, False)
        if split.in_sample(doc, probability)
    )
    t0 = time.perf_counter()
    log(
        f"training tokenizer: BPE, vocab {config.model.vocab_size}, byte fallback, on "
        f"{min(counts[False][1], d.tokenizer_sample_bytes) / 1e6:.1f} MB of "
        f"{counts[False][0]} training documents"
    )
    with cache.atomic_dir(path.parent) as tmp:
        tok.train(sample, config.model.vocab_size, tmp / path.name)
    log(f"  -> {path} ({time.perf_counter() - t0:.1f}s)")
    return tok.SentencePieceTokenizer(path)


def _check_split(train_docs: int, val_docs: int, fraction: float) -> None:
    if train_docs + val_docs == 0:
        raise ConfigError("config.data.paths: the corpus holds no documents (all files empty)")
    if val_docs == 0:
        raise ConfigError(
            f"config.data.val_fraction: {fraction} of {train_docs} documents held out none; "
            "raise data.val_fraction or add documents"
        )
    if train_docs == 0:
        raise ConfigError(
            f"config.data.val_fraction: {fraction} of {val_docs} documents left none for "
            "training; lower data.val_fraction or add documents"
        )


def _chunks(iterable, size: int):
    chunk = []
    for item in iterable:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _tokenise_text(
    corpus, tk: Tokenizer, eos_id: int, fraction: float, out: Path, progress: bool
) -> dict:
    dtype = token_cache.token_dtype(tk.vocab_size)
    docs = {False: 0, True: 0}
    nbytes = {False: 0, True: 0}
    with (
        token_cache.TokenWriter(out / "train.npy", dtype) as train_w,
        token_cache.TokenWriter(out / "val.npy", dtype) as val_w,
    ):
        writers = {False: train_w, True: val_w}
        bar = tqdm(desc="tokenising", unit=" doc", disable=not progress, leave=False)
        for chunk in _chunks(corpus.documents(), _ENCODE_CHUNK):
            for doc, ids in zip(chunk, tk.encode_batch(chunk), strict=True):
                is_val = split.is_validation(doc, fraction)
                ids.append(eos_id)
                writers[is_val].write(ids)
                docs[is_val] += 1
                nbytes[is_val] += len(doc.encode("utf-8"))
                bar.update(1)  # per document: a small corpus is one chunk
        bar.refresh()
        bar.close()
        _check_split(docs[False], docs[True], fraction)
    train_tokens, val_tokens = train_w.count, val_w.count
    return {
        "train_documents": docs[False],
        "val_documents": docs[True],
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "train_bytes": nbytes[False],
        "val_bytes": nbytes[True],
        "bytes_per_token": nbytes[False] / max(1, train_tokens - docs[False]),
        "token_dtype": dtype.name,
    }


def _split_shards(
    corpus, max_id: int, fraction: float, out: Path, progress: bool, given: Tokenizer | None
) -> dict:
    eos_id = corpus.eos_id
    dtype = token_cache.token_dtype(max(max_id, eos_id) + 1)
    docs = {False: 0, True: 0}
    total = sum(len(s) for s in corpus.shards)
    with (
        token_cache.TokenWriter(out / "train.npy", dtype) as train_w,
        token_cache.TokenWriter(out / "val.npy", dtype) as val_w,
    ):
        writers = {False: train_w, True: val_w}
        with tqdm(
            total=total,
            desc="splitting shards",
            unit=" tok",
            unit_scale=True,
            disable=not progress,
            leave=False,
        ) as bar:
            for doc in corpus.documents():
                is_val = split.is_validation(doc, fraction)
                writers[is_val].write(doc)
                writers[is_val].write((eos_id,))
                docs[is_val] += 1
                bar.update(len(doc) + 1)
        _check_split(docs[False], docs[True], fraction)
    bytes_per_token = 0.0
    if given is not None:  # estimate from a decoded prefix of the training split
        prefix = token_cache.open_tokens(out / "train.npy")[:_BPT_SAMPLE_TOKENS]
        text_ids = prefix[prefix != eos_id]
        nbytes = len(given.decode(text_ids.tolist()).encode("utf-8"))
        bytes_per_token = nbytes / max(1, len(text_ids))
    return {
        "train_documents": docs[False],
        "val_documents": docs[True],
        "train_tokens": train_w.count,
        "val_tokens": val_w.count,
        "train_bytes": 0,
        "val_bytes": 0,
        "bytes_per_token": bytes_per_token,
        "token_dtype": dtype.name,
        "max_id": int(max_id),
    }
