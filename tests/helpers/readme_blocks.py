"""Fenced code blocks of the project's Markdown, as the executable-README test runs them.

A block is classified by its info string:

* ``bash``/``sh``/``shell``: commands, one per line (``\\`` continues a line;
  blank and comment-only lines are dropped).  A trailing comment containing
  ``exit status N`` says the command is expected to end with status N
  (default 0).
* ``console``: ``$ command`` lines, each followed by the output it prints
  (compared with the real output, line by line, trailing spaces ignored).
* ``python`` whose first line is ``# path/to/file.py``: a file the reader is
  told to write; it is written into the sandbox before later blocks run.
* ``text``, ``json``, ``yaml``, ``toml``, ``csv``, ``math``: not commands.

Anything else, an untagged fence included, is an error: every command block
must be runnable or explicitly marked.  An HTML comment right above a fence,
``<!-- readme-test: skip: REASON -->``, marks a block that cannot run here
(the reason is required); ``<!-- readme-test: run: COMMAND -->`` anywhere is
a hidden command run at that point (set-up the reader has already done).

Each block also records the ``## `` section it is in (:attr:`Block.section`);
:func:`parts` groups a document's blocks into independent parts that can run in
separate sandboxes (and so in parallel).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from paths import REPO

COMMAND_LANGS = ("bash", "sh", "shell")
NOT_COMMANDS = ("text", "json", "yaml", "toml", "csv", "math")
_FENCE = re.compile(r"^(```+)\s*([A-Za-z0-9_+-]*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(skip|run):\s*(.*?)\s*-->\s*$")
_EXIT = re.compile(r"#.*\bexit status (\d+)")
_SECTION = re.compile(r"^##\s+(.*?)\s*$")
# What one block can leave for a later one: a run directory (``runs/NAME``, as a
# word of the command) or a path under the home directory (``~/...``).
_LEFT_BEHIND = re.compile(r"(?:^|[\s='\"])((?:\./)?runs/[\w.-]+|~/[\w.-]+(?:/[\w.-]+)*)")


@dataclasses.dataclass
class Command:
    text: str  # what bash runs
    expect_status: int = 0
    expect_output: list[str] | None = None  # console blocks: the shown output


@dataclasses.dataclass
class Block:
    doc: str
    line: int  # 1-based line of the opening fence (or of the directive)
    lang: str
    body: str
    skip: str | None = None  # reason, when marked not runnable here
    hidden: bool = False  # a <!-- readme-test: run: --> command
    file: str | None = None  # python blocks: the path they are written to
    section: str = ""  # the title of the ``## `` section holding it ("" before the first)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def commands(self) -> list[Command]:
        if self.lang == "console":
            return _console(self.body)
        if self.lang in COMMAND_LANGS:
            return _bash(self.body)
        return []


def parse(path: Path, root: Path) -> list[Block]:
    """Every fenced block and hidden command of one Markdown file, in order."""
    doc = str(path.relative_to(root))
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    pending_skip: str | None = None
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = _SECTION.match(line)
        if heading:
            section = heading.group(1)
        directive = _DIRECTIVE.match(line.strip())
        if directive:
            kind, arg = directive.groups()
            if kind == "run":
                blocks.append(Block(doc, i + 1, "bash", arg, hidden=True, section=section))
            else:
                if not arg:
                    raise ValueError(f"{doc}:{i + 1}: readme-test: skip needs a reason")
                pending_skip = arg
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if line.strip():
                pending_skip = None  # a skip applies only to the fence right below it
            i += 1
            continue
        ticks, lang = fence.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = "\n".join(lines[i + 1:end])
        block = Block(doc, i + 1, lang, body, skip=pending_skip, section=section)
        if lang == "python":
            first = body.splitlines()[0].strip() if body.strip() else ""
            m = re.fullmatch(r"#\s*(\S+\.py)", first)
            block.file = m.group(1) if m else None
        blocks.append(block)
        pending_skip = None
        i = end + 1
    return blocks


def parts(blocks: list[Block]) -> list[list[Block]]:
    """The runnable blocks of one document, split into parts that do not depend on
    each other, each in document order.

    A part starts as one ``## `` section; parts are joined when one block's text
    names what another's may leave behind (the same ``runs/NAME`` directory, the
    same ``~/`` path, or a file a ``python`` block writes), so a command that reads
    an earlier command's output always runs after it, in the same sandbox.  Files
    of the checkout (``experiments/micro.py``) are copied into every sandbox and
    join nothing.  A dependency this misses is not hidden: the later command finds
    nothing there and fails."""
    runnable = [b for b in blocks if b.skip is None and (b.file or b.commands())]
    sections = list(dict.fromkeys(b.section for b in runnable))
    owner = {s: s for s in sections}  # union-find over sections

    def root(s: str) -> str:
        while owner[s] != s:
            s = owner[s]
        return s

    first_section: dict[str, str] = {}
    for b in runnable:
        names = set(_LEFT_BEHIND.findall(b.body))
        if b.file:
            names.add(b.file)
        names |= {f for f in (x.file for x in runnable) if f and f in b.body}
        for name in names:
            name = name.removeprefix("./")
            if name in first_section:
                owner[root(b.section)] = root(first_section[name])
            else:
                first_section[name] = b.section
    groups: dict[str, list[Block]] = {}
    for b in runnable:
        groups.setdefault(root(b.section), []).append(b)
    return [g for g in groups.values() if any(b.commands() for b in g)]


def problem(block: Block) -> str | None:
    """Why a block can be neither run nor ignored (None when it is fine)."""
    if block.skip is not None:
        return None
    if block.lang in COMMAND_LANGS or block.lang == "console" or block.lang in NOT_COMMANDS:
        return None
    if block.lang == "python":
        return None if block.file else (
            "a python block must start with '# path/to/file.py' (a file to write) or be "
            "marked <!-- readme-test: skip: REASON -->")
    return (f"fence tagged {block.lang!r}: tag it bash/console (commands), python (a file) or "
            f"{'/'.join(NOT_COMMANDS)} (not commands), or mark it "
            "<!-- readme-test: skip: REASON -->")


def _logical_lines(body: str) -> list[str]:
    out, current = [], ""
    for raw in body.splitlines():
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            out.append(current.strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _bash(body: str) -> list[Command]:
    commands = []
    for line in _logical_lines(body):
        if line.startswith("#"):
            continue
        m = _EXIT.search(line)
        commands.append(Command(line, int(m.group(1)) if m else 0))
    return commands


def _console(body: str) -> list[Command]:
    commands: list[Command] = []
    for raw in body.splitlines():
        if raw.startswith("$ "):
            text = raw[2:].strip()
            m = _EXIT.search(text)
            commands.append(Command(text, int(m.group(1)) if m else 0, []))
        elif commands:
            commands[-1].expect_output.append(raw.rstrip())
        elif raw.strip():
            raise ValueError(f"console block: output {raw!r} before any '$ ' command")
    for c in commands:
        while c.expect_output and not c.expect_output[-1]:
            c.expect_output.pop()
    return commands


# The project's documents, whose blocks the tests check (tests/unit/test_readme.py)
# and run (tests/integration/test_readme_commands.py), and the README's two install
# prefixes: the tests' (the dev extra), which CI runs before the tests, and the main
# job's (the package alone); the command tests take both as done.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'"
CORE_INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e ."


def project_blocks(doc: Path) -> list[Block]:
    """:func:`parse` of one of the project's documents, named relative to the checkout."""
    return parse(doc, REPO)
