"""The completion-only NLL suite for code, STEM and math (``nll-code-stem-math``).

Six tasks scored as the original's ``eval/run_nll_eval_coding_stem_math.py``
scores them: the NLL of a reference completion given a prompt.  The formats,
the tokenisation and the one departure: docs/EVAL.md, "The completion-only NLL
suite"."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from collections.abc import Callable
from typing import Any

from depthbench.errors import ConfigError

SUITE = "nll-code-stem-math"


def leading_space(prompt: str, target: str) -> str:
    """One space between prompt and target unless either side already has whitespace."""
    if target and prompt and not prompt[-1].isspace() and not target[0].isspace():
        return " " + target
    return target


def format_mbpp(doc: dict) -> tuple[str, str]:
    tests = list(doc["test_list"] or [])
    tests += [""] * (3 - len(tests))
    prompt = ("You are an expert Python programmer, and here is your task: "
              f"{doc['text']} Your code should pass these tests:\n\n"
              f"{tests[0]}\n{tests[1]}\n{tests[2]}\n[BEGIN]\n")
    code = str(doc["code"])
    return prompt, code if code.endswith("\n") else code + "\n"


def format_humaneval(doc: dict) -> tuple[str, str]:
    return str(doc["prompt"]), str(doc["canonical_solution"])


def format_sciq(doc: dict) -> tuple[str, str]:
    prompt = f"Question: {doc['question']}\nAnswer:"
    return prompt, leading_space(prompt, f"{doc['correct_answer']}\nExplanation: {doc['support']}")


def gpqa_choices(doc: dict) -> list[str]:
    """The four answers in the original's deterministic per-record order."""
    choices = [str(doc[k]).strip() for k in ("Correct Answer", "Incorrect Answer 1",
                                             "Incorrect Answer 2", "Incorrect Answer 3")]
    key = str(doc.get("Record ID") or doc["Question"])
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    random.Random(seed).shuffle(choices)
    return choices


def format_gpqa(doc: dict) -> tuple[str, str]:
    listed = "\n".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(gpqa_choices(doc)))
    prompt = f"Question: {str(doc['Question']).strip()}\nChoices:\n{listed}\nAnswer:"
    target = str(doc["Correct Answer"]).strip()
    explanation = str(doc.get("Explanation") or "").strip()
    if explanation:
        target += f"\nExplanation: {explanation}"
    return prompt, leading_space(prompt, target)


def format_gsm8k(doc: dict) -> tuple[str, str]:
    prompt = f"Question: {doc['question']}\nAnswer:"
    return prompt, leading_space(prompt, str(doc["answer"]))


def format_math500(doc: dict) -> tuple[str, str]:
    prompt = f"Problem:\n{doc['problem']}\n\nSolution:"
    return prompt, leading_space(prompt, str(doc.get("solution") or doc.get("answer")))


@dataclasses.dataclass(frozen=True)
class NLLTask:
    name: str
    category: str
    hf_path: str
    hf_name: str | None
    split: str
    fields: tuple[str, ...]  # required record fields
    format: Callable[[dict], tuple[str, str]]


TASKS: dict[str, NLLTask] = {t.name: t for t in (
    NLLTask("mbpp", "coding", "google-research-datasets/mbpp", "full", "test",
            ("text", "test_list", "code"), format_mbpp),
    NLLTask("humaneval", "coding", "openai/openai_humaneval", None, "test",
            ("prompt", "canonical_solution"), format_humaneval),
    NLLTask("sciq", "stem", "allenai/sciq", None, "test",
            ("question", "correct_answer", "support"), format_sciq),
    NLLTask("gpqa_diamond", "stem", "Idavidrein/gpqa", "gpqa_diamond", "train",
            ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
             "Incorrect Answer 3"), format_gpqa),
    NLLTask("gsm8k", "math", "openai/gsm8k", "main", "test", ("question", "answer"),
            format_gsm8k),
    NLLTask("math500", "math", "HuggingFaceH4/MATH-500", None, "test", ("problem",),
            format_math500),
)}
CATEGORIES = ("coding", "stem", "math")


def examples(task: NLLTask, docs: list[dict], source: str) -> list[tuple[str, str]]:
    """(prompt, target) of every record; a missing field or an empty target is
    one ConfigError naming the source and the record."""
    out = []
    for i, doc in enumerate(docs):
        missing = [f for f in task.fields if f not in doc]
        if task.name == "math500" and not (doc.get("solution") or doc.get("answer")):
            missing.append("solution")
        if missing:
            raise ConfigError(f"{source}: record {i} lacks field {missing[0]!r} "
                              f"({task.name} needs {', '.join(task.fields)})")
        prompt, target = task.format(doc)
        if not target.strip():
            raise ConfigError(f"{source}: record {i} of {task.name} has an empty target; "
                              "completion-only NLL needs a non-empty completion")
        out.append((prompt, target))
    return out


def encode_pair(encode: Callable[[str], list[int]], prompt: str, target: str,
                prefix_id: int) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: the prompt's trailing whitespace moves to the
    target, the pair is encoded whole, and the target's tokens are those after
    the prompt's own encoding (an empty prompt is conditioned on ``prefix_id``)."""
    if not prompt:
        ids = encode(target)
        return ([prefix_id], ids) if not ids or ids[0] != prefix_id else (ids[:1], ids[1:])
    n = len(prompt) - len(prompt.rstrip())
    if n:
        prompt, target = prompt[:-n], prompt[-n:] + target
    whole, context = encode(prompt + target), encode(prompt)
    return context, whole[len(context):]


def totals(nll_sum: float, tokens: int) -> dict[str, Any]:
    mean = nll_sum / tokens if tokens else math.nan
    return {"num_target_tokens": tokens, "nll_sum": nll_sum, "nll_mean": mean,
            "perplexity": math.exp(mean) if tokens else math.nan, "completion_only": True}


def score_task(scorer, tokenizer, prefix_id: int, task: NLLTask, pairs: list[tuple[str, str]],
               source: str) -> dict[str, Any]:
    """Completion-only NLL of one task's (prompt, target) pairs."""
    encoded = []
    for i, (prompt, target) in enumerate(pairs):
        ctx, tgt = encode_pair(tokenizer.encode, prompt, target, prefix_id)
        if not tgt:
            raise ConfigError(f"{source}: record {i} of {task.name}: the target encodes to no "
                              "tokens; completion-only NLL needs at least one")
        encoded.append((ctx, tgt))
    scored = scorer.loglikelihood(encoded, desc=task.name)
    nll_sum = -sum(lp for lp, _, _ in scored)
    tokens = sum(n for _, _, n in scored)
    L = scorer.max_length
    return {"dataset": task.name, "category": task.category, "source": source,
            "num_examples": len(pairs), **totals(nll_sum, tokens),
            "windowed": sum(len(t) > L for _, t in encoded),
            "context_truncated": sum(len(c) + len(t) > L + 1 and len(t) <= L
                                     for c, t in encoded)}


def aggregate(task_results: dict[str, dict]) -> tuple[dict, dict]:
    """(per-category totals, overall totals), token-weighted."""
    cats = {}
    for cat in CATEGORIES:
        rs = [r for r in task_results.values() if r["category"] == cat]
        if rs:
            cats[cat] = totals(sum(r["nll_sum"] for r in rs),
                               sum(r["num_target_tokens"] for r in rs))
    rs = list(task_results.values())
    return cats, totals(sum(r["nll_sum"] for r in rs), sum(r["num_target_tokens"] for r in rs))
