"""Tiny tokenizers, run directories and made-up task records shared by the eval tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from analysis_tiny import tiny_config, write_run

CORPUS = [
    "Question: How many apples are left if Tom eats two of five? Answer: 5 - 2 = 3.",
    "def add(a, b):\n    return a + b\n\nassert add(1, 2) == 3",
    "The mitochondria is the powerhouse of the cell. Water boils at 100 degrees.",
    "Problem:\nSolve x + 1 = 2.\n\nSolution: x = 1, so the answer is $\\boxed{1}$.",
    "Choices:\nA. red\nB. blue\nC. green\nD. yellow\nExplanation: the sky scatters blue light.",
] * 4


def tiny_tokenizer(directory: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer.json (any text encodes; decode round-trips),
    specials <unk> <s> </s>, and a tokenizer_config.json naming them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return directory / "tokenizer.json"


def tiny_run(run_dir: Path, *, seq_len: int = 32, vocab_size: int = 320, family: str = "pre_ln",
             depth: int = 2, seed: int = 0, noise: float = 0.3) -> Path:
    """A depthbench run directory (random weights, big enough noise that the
    model is far from uniform) carrying a tokenizer.json."""
    config = tiny_config(family, depth, **{"model.vocab_size": vocab_size,
                                           "train.seq_len": seq_len})
    write_run(run_dir, config, seed=seed, noise=noise)
    tok_dir = run_dir.parent / f".tok-{run_dir.name}"
    tiny_tokenizer(tok_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, run_dir / name)
    return run_dir


RECORDS = {
    "mbpp": [{"text": "Write a function to add two numbers.",
              "code": "def add(a, b):\n    return a + b",
              "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]}],
    "humaneval": [{"prompt": "def inc(x):\n    \"\"\"Return x + 1.\"\"\"\n",
                   "canonical_solution": "    return x + 1\n"}],
    "sciq": [{"question": "What boils at 100 degrees?", "correct_answer": "water",
              "support": "Water boils at 100 degrees at sea level."},
             {"question": "What is the powerhouse of the cell?", "correct_answer": "mitochondria",
              "support": "The mitochondria make energy."}],
    "gpqa_diamond": [{"Question": "Which colour does the sky scatter most? ",
                      "Correct Answer": " blue", "Incorrect Answer 1": "red",
                      "Incorrect Answer 2": "green", "Incorrect Answer 3": "yellow",
                      "Record ID": "rec-1", "Explanation": "Rayleigh scattering."}],
    "gsm8k": [{"question": "Tom has 5 apples and eats 2. How many are left?",
               "answer": "5 - 2 = 3\n#### 3"}],
    "math500": [{"problem": "Solve x + 1 = 2.", "solution": "x = 1, so $\\boxed{1}$.",
                 "answer": "1"}],
}


def write_records(directory: Path, records: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for task, rows in (records or RECORDS).items():
        (directory / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory
