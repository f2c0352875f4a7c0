"""Shared code names no residual family: what differs by family lives in the
family's file (a capability, a declared option) or comes from the registry.

Scanned: all of src/depthbench but the families themselves (model/residual/),
the bundled specs (configs/: experiments name the families they run) and
reference.py (the original's published numbers, by family).  pallas_kernels
is not scanned: its kernels are family code by nature, namespaced by the math
they fuse (hc_pre, mhc_pre, moda_attention), and only a family's file calls
them.  A family's name may appear in comments, docstrings and help text (the
``help=``/``summary=`` of an option, a command's ``EPILOG`` of examples),
never in code's names or other strings.
"""

from __future__ import annotations

import io
import re
import tokenize

from paths import SRC

from depthbench.model.residual.protocol import registry

NOT_SCANNED = ("model/residual/", "configs/", "reference.py")
PROSE = {"help", "summary", "EPILOG"}  # a string given to one of these is help text


def _code_tokens(text: str):
    """(line, text) of every name and non-docstring, non-help string of ``text``."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
              if t.type not in (tokenize.NL, tokenize.COMMENT)]
    starts = (tokenize.STRING, getattr(tokenize, "FSTRING_START", -1))
    ends = (tokenize.STRING, getattr(tokenize, "FSTRING_END", -1))
    statement = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)
    prose = False  # inside a docstring or the (implicitly joined) strings of a help text
    for i, tok in enumerate(tokens):
        if tok.type in starts:
            j = i - 1
            if j >= 0 and tokens[j].type in ends:
                pass  # a string joined to the one before: as it was
            else:
                while j >= 0 and tokens[j].string == "(":
                    j -= 1
                prose = j < 0 or tokens[j].type in statement or (
                    tokens[j].string == "=" and j >= 1 and tokens[j - 1].string in PROSE)
        elif tok.type not in (getattr(tokenize, "FSTRING_MIDDLE", -1), *ends) and (
                tok.string != ")"):
            prose = False
        if prose:
            continue
        if tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(
                tokenize, "FSTRING_MIDDLE", -1):
            yield tok.start[0], tok.string


def test_generic_code_names_no_family():
    names = "|".join(sorted(registry.names(), key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9])({names})(?![A-Za-z0-9])")
    root = SRC / "depthbench"
    files = [p for p in sorted(root.rglob("*.py"))
             if not p.relative_to(root).as_posix().startswith(NOT_SCANNED)]
    assert len(files) > 120
    found = [f"{p.relative_to(root)}:{line}: {m.group(1)}" for p in files
             for line, text in _code_tokens(p.read_text()) for m in pattern.finditer(text)]
    assert found == []


def test_the_check_finds_a_name_in_a_string_but_not_in_a_docstring():
    text = 'def f():\n    """hc in a docstring"""\n    # hc in a comment\n    return "hc"\n'
    assert [s for _, s in _code_tokens(text) if "hc" in s] == ['"hc"']


def test_the_check_skips_help_text_but_not_code_beside_it():
    text = ('EPILOG = """run hc"""\n'
            'p.add_argument("--f", default="hc", help="like hc" "or mhc")\n'
            'p.add_argument(help=("one " "hc"), dest="mhc")\n')
    assert [s for _, s in _code_tokens(text) if "hc" in s] == ['"hc"', '"mhc"']
