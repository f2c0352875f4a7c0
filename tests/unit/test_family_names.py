"""Shared code names no residual family: what differs by family lives in the
family's file (a capability) or comes from the registry.

Scanned: config.py, importers/, exporters/, analysis/, equal_compute/ and the decoder
(model/decode.py, model/past_attention.py, generation/, cli/generate.py: what a
family caches across positions is its own capability); the trainer, sharding and
costs have their own tests.  A family's name may appear in
comments and docstrings (as an example), never in the code's names or strings.
"""

from __future__ import annotations

import io
import re
import tokenize

from paths import SRC

from depthbench.model.residual.protocol import registry

GENERIC = ["config.py", "importers", "exporters", "analysis", "equal_compute",
           "model/decode.py", "model/past_attention.py", "generation", "cli/generate.py"]


def _code_tokens(text: str):
    """(line, text) of every name and non-docstring string of ``text``."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    skip = (tokenize.NL, tokenize.COMMENT)
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.STRING:
            j = i - 1
            while j >= 0 and tokens[j].type in skip:
                j -= 1
            if j < 0 or tokens[j].type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                           tokenize.ENCODING):
                continue  # a docstring
        if tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(
                tokenize, "FSTRING_MIDDLE", -1):
            yield tok.start[0], tok.string


def test_generic_code_names_no_family():
    names = "|".join(sorted(registry.names(), key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9])({names})(?![A-Za-z0-9])")
    root = SRC / "depthbench"
    files = [p for g in GENERIC for p in ([root / g] if g.endswith(".py") else
                                          sorted((root / g).rglob("*.py")))]
    assert len(files) > 20
    found = [f"{p.relative_to(root)}:{line}: {m.group(1)}" for p in files
             for line, text in _code_tokens(p.read_text()) for m in pattern.finditer(text)]
    assert found == []


def test_the_check_finds_a_name_in_a_string_but_not_in_a_docstring():
    text = 'def f():\n    """hc in a docstring"""\n    # hc in a comment\n    return "hc"\n'
    assert [s for _, s in _code_tokens(text) if "hc" in s] == ['"hc"']
