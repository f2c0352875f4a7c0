"""Micro fine-tuning per family and aspect ratio: the held-out instruction loss before and after.

    python -m bench.finetune                                   # every family, depths 2, 4, 10
    python -m bench.finetune --families pre_ln,hc --depths 4 --workdir /tmp/ft

A real sweep, in-process (``depthbench sweep``'s own code): each (family,
depth) of the micro suite is pretrained on the bundled micro corpus (the
quickstart's recipe, ``--pretrain-steps`` steps), then, the spec setting
``finetune.records``, fine-tuned into ``RUN_DIR/sft/`` with the original's
recipe shrunk to the micro scale (:data:`RECIPE`: one epoch,
batches of 16 rows of 160 tokens, lr 1e-3, fp32 on a CPU) and the report's
"Fine-tuning" table is printed: the held-out loss over response tokens of
the pretrained model (step 0 of the fine-tuning) and of the fine-tuned one.

The instruction records are written from real text, the micro corpus's
Wikipedia documents (``--records``), three tasks in turn: complete a
sentence from its first half, name the subject a passage's first sentence
introduces, repeat a sentence's first four words.  (The documents are the
pretraining corpus's too: what fine-tuning teaches here is the template and
the tasks, not the text.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from bench import common

DEPTHS = (2, 4, 10)  # micro suite: aspect ratios 76, 30, 8
SPEC = """
from depthbench.configs import quickstart


def get_config():
    c = quickstart.get_config()
    c.name = "finetune_micro"
    c.train.steps = {steps}
    c.train.eval_every = c.train.checkpoint_every = {steps}
    f = c.finetune
    f.records, f.spec = {records!r}, {recipe!r}
    f.epochs, f.max_seq_len, f.val_fraction = 1.0, 161, 0.1
    return c


def get_sweep():
    return [{{"model.family": f, "model.depth": d}} for f in {families!r} for d in {depths!r}]
"""
RECIPE = """
from depthbench.configs import sft


def get_config():
    c = sft.get_config()
    c.model.compute_dtype = "float32"  # a CPU computes bf16 no faster
    t = c.train
    t.batch_size, t.seq_len, t.lr = 16, 160, 1e-3
    t.log_every, t.checkpoint_every = 5, 1000
    return c
"""
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_SUBJECT = re.compile(r"^(.{3,60}?) (?:is|was|are|were) (?:a|an|the) ")


def records_from(documents: Path, n: int) -> list[dict]:
    """``n`` instruction records from the corpus's Wikipedia documents, the tasks in turn."""
    out: list[dict] = []
    with open(documents) as f:
        for line in f:
            doc = json.loads(line)
            if doc.get("source") != "wikipedia":
                continue
            # short, plain sentences: each record fits the rows with room to spare
            sentences = [s for s in _SENTENCE.split(doc["text"].replace("\n", " "))
                         if 8 <= len(s.split()) <= 18 and len(s) <= 110 and s.isascii()]
            if len(sentences) < 2:
                continue
            task, first, later = len(out) % 3, sentences[0], sentences[1]
            if task == 0:
                words = later.split()
                out.append({"instruction": "Complete the sentence.",
                            "input": " ".join(words[:len(words) // 2]),
                            "output": " ".join(words[len(words) // 2:])})
            elif task == 1 and (m := _SUBJECT.match(first)):
                out.append({"instruction": "Name the subject this passage introduces.",
                            "input": first, "output": m.group(1)})
            elif task == 2:
                out.append({"instruction": "Repeat the first four words of the text.",
                            "input": later, "output": " ".join(later.split()[:4])})
            if len(out) == n:
                break
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=None,
                        help="comma-separated (default: every registered family)")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    parser.add_argument("--pretrain-steps", type=int, default=60)
    parser.add_argument("--records", type=int, default=480)
    parser.add_argument("--workdir", default="/tmp/depthbench-bench-finetune")
    args = parser.parse_args(argv)
    from depthbench import report
    from depthbench.model.residual.protocol import registry

    families = tuple(args.families.split(",")) if args.families else tuple(registry.names())
    from depthbench.cli import main as cli_main
    from depthbench.config import load
    from depthbench.data import cache

    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    documents = next((cache.cache_root("") / "micro").glob("*/documents.jsonl"), None)
    if documents is None:  # the corpus is fetched by the first run that needs it
        from depthbench import data

        data.prepare(load("quickstart"), progress=False)
        documents = next((cache.cache_root("") / "micro").glob("*/documents.jsonl"))
    records = root / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in records_from(documents,
                                                                          args.records)))
    (root / "recipe.py").write_text(RECIPE)
    spec = root / "spec.py"
    spec.write_text(SPEC.format(steps=args.pretrain_steps, records=str(records),
                                recipe=str(root / "recipe.py"),
                                families=families,
                                depths=tuple(int(d) for d in args.depths.split(","))))
    print(common.header("micro fine-tuning: held-out instruction loss before -> after"))
    start = time.time()
    code = cli_main(["sweep", "--config", str(spec), "--workdir", str(root / "sweep"),
                     "--no-progress"])
    if code:
        sys.exit(code)
    rep = report.write_report(root / "sweep", plots=False)
    text = (root / "sweep" / "report.md").read_text()
    section = text[text.index("## Fine-tuning"):text.index("## All runs")]
    print(section.split("## Downstream evaluation")[0].rstrip())
    print(f"\n{len(rep.rows)} runs pretrained and fine-tuned in {time.time() - start:.0f} s "
          f"({args.pretrain_steps} pretraining steps of 8 x 128; fine-tuning: 1 epoch of "
          f"{sum(1 for _ in open(records))} records, 10% held out)")


if __name__ == "__main__":
    main()
