"""Bad input across every command, as a table shared by the two tiers: the cases
(argv against a scratch disk, and the pattern of the one stderr line each must
give), the ``disk`` fixture they run against (a ``pytest_plugins`` module of
tests/conftest.py), and the checks of one case's outcome: exit status 2, one
line ``depthbench: error: ...``, the disk as it was (:func:`snapshot`).
:data:`ENV_CASES` does the same for the environment variables the package reads.
tests/unit/test_bad_inputs_commands.py runs every case in-process,
tests/integration/test_bad_inputs_in_a_process.py a few in real processes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from analysis_tiny import tiny_config, write_run
from eval_tiny import tiny_tokenizer, write_records

SPEC_HEAD = ("from depthbench.config import base_config\n\n"
             "def get_config():\n    return base_config()\n\n")


TWO_RUNS = "return [{'train.seed': 0}, {'train.seed': 1}]"


# Sweep specs that fail: (file, body of get_sweep(), id, pattern of the line);
# each case runs `sweep --config FILE --workdir DIR --list`.
BAD_SWEEP_SPECS = [
    ("sweep_raises.py", "raise RuntimeError('no sweep today')", "get_sweep() raises",
     r"config: get_sweep\(\) in '\S+sweep_raises\.py' failed: RuntimeError: no sweep today$"),
    ("sweep_dict.py", "return {'train.lr': 0.1}", "get_sweep() returns a dict",
     r"get_sweep\(\) in '\S+' must return a list of dicts \{'section\.field': value\}, "
     r"got dict$"),
    ("sweep_none.py", "return None", "get_sweep() returns None",
     r"get_sweep\(\) in '\S+' must return a list of dicts .*, got NoneType$"),
    ("sweep_empty.py", "return []", "get_sweep() returns no runs",
     r"config: get_sweep\(\) in '\S+sweep_empty\.py' returned no runs$"),
    ("sweep_float_text.py", "return [{'train.lr': 'fast'}]", "a float field set to text",
     r"sweep run 0 \(train\.lr='fast'\): --config\.train\.lr: expected a number, got 'fast'$"),
    ("sweep_int_list.py", "return [{'model.depth': [8]}]", "an integer field set to a list",
     r"sweep run 0 \(\S+\): config\.model\.depth: expected int, got \[8\]$"),
    ("sweep_twins.py", "return [{'train.seed': 1}, {'train.seed': 1}]",
     "two runs with one name",
     r"runs 0 and 1 have the same name 'seed1' \(identical overrides\?\)$"),
]


# Family modules for $DEPTHBENCH_FAMILIES that fail as it loads them (in disk/plugins).
FAMILY_MODULES = {
    "family_raises": "raise RuntimeError('no families today')\n",
    "family_takes_pre_ln": ("from depthbench.model.residual.protocol import registry\n"
                            "from depthbench.model.residual.pre_ln import PreLN\n\n\n"
                            "class Again(PreLN):\n    name = 'pre_ln'\n\n\n"
                            "registry.register(Again)\n"),
    "family_twice": ("from depthbench.model.residual.protocol import registry\n"
                     "from depthbench.model.residual.pre_ln import PreLN\n\n\n"
                     "class One(PreLN):\n    name = 'twice'\n\n\n"
                     "class Two(PreLN):\n    name = 'twice'\n\n\n"
                     "registry.register(One)\nregistry.register(Two)\n"),
}


@pytest.fixture(scope="module")
def disk(tmp_path_factory) -> Path:
    """A scratch disk: a run directory (one checkpoint at step 7, a validation
    split, a tokenizer.json), NLL records, sweep specs, damaged sweep tables."""
    root = tmp_path_factory.mktemp("disk")
    run = root / "run"
    write_run(run, tiny_config("pre_ln", 2, **{"model.vocab_size": 320,
                                                "train.seq_len": 32}), val_tokens=1200)
    shutil.copy(tiny_tokenizer(root / "tok"), run / "tokenizer.json")
    write_records(root / "records")
    for name, family, fields in (("run_mix_ln", "mix_ln", {}),
                                 ("run_lns_quarter", "lns", {"model.residual.lns_power": 0.25})):
        (root / name).mkdir()  # a config.json is all an export reads before refusing
        (root / name / "config.json").write_text(json.dumps(tiny_config(family, 2,
                                                                         **fields).to_dict()))
    (root / "sft_no_output.json").write_text(json.dumps([{"instruction": "Say hi."}]))
    (root / "sft_empty.jsonl").write_text("\n")
    (root / "a_file").write_text("I am a file, not a directory\n")
    (root / "prompts_text.jsonl").write_text("The sky is\n")  # plain text, not JSON lines
    (root / "prompts_no_field.jsonl").write_text(json.dumps({"text": "The sky is"}) + "\n")
    (root / "prompts_empty.jsonl").write_text(json.dumps({"prompt": ""}) + "\n")
    # JSON Lines end at \n only: a U+2028 inside a string (as json.dumps writes it with
    # ensure_ascii=False) is text, so the bad record after it is on line 2.
    u2028 = json.dumps({"prompt": "a\u2028b", "instruction": "a\u2029b", "output": "c"},
                       ensure_ascii=False) + "\n"
    for kind, bad in (("prompts", {"text": "x"}), ("sft", {"instruction": "x"})):
        (root / f"{kind}_after_u2028.jsonl").write_text(u2028 + json.dumps(bad) + "\n")
        (root / f"{kind}_surrogate.jsonl").write_text(  # JSON's escape of a lone surrogate
            '{"prompt": "a\\ud800b", "instruction": "a\\ud800b", "output": "c"}\n')
        (root / f"{kind}_nan.jsonl").write_text(  # NaN: Python's json writes it, JSON lacks it
            '{"prompt": "a", "instruction": "a", "output": "c", "score": NaN}\n')
    (root / "sft_ok.jsonl").write_text("".join(json.dumps(
        {"instruction": f"Say {w}.", "output": w}) + "\n" for w in ("hi", "yes", "no")))
    (root / "empty").mkdir()
    (root / "sweep_get_config_raises.py").write_text(
        "def get_config():\n    raise KeyError('model')\n\n"
        "def get_sweep():\n    return [{'train.seed': 0}]\n")
    for name, body, _, _ in [*BAD_SWEEP_SPECS, ("sweep_two.py", TWO_RUNS, "", "")]:
        (root / name).write_text(f"{SPEC_HEAD}def get_sweep():\n    {body}\n")
    tables = {"bytes": b"garbage\x00\xff\n,,,\n", "columns": b"name,family\nx,y\n"}
    for name, text in tables.items():
        (root / f"sweep_{name}").mkdir()
        (root / f"sweep_{name}" / "results.csv").write_bytes(text)
    (root / "sweep_manifest_only").mkdir()
    (root / "sweep_manifest_only" / "sweep.json").write_text("{}")
    np.save(root / "tokens.npy", np.arange(10, dtype=np.uint16))
    (root / "loop_a").symlink_to(root / "loop_b")  # a link loop: every output path refuses it
    (root / "loop_b").symlink_to(root / "loop_a")
    (root / "plugins").mkdir()
    for name, source in FAMILY_MODULES.items():
        (root / "plugins" / f"{name}.py").write_text(source)
    return root


def _run(d: Path) -> str:
    return str(d / "run")


def _analyze(d: Path, *extra: str) -> list[str]:
    return ["analyze", _run(d), "--windows", "4", "--seq-len", "16", "--no-plots", *extra]


def _nll(d: Path, *extra: str) -> list[str]:
    return ["eval", _run(d), "--suite", "nll-code-stem-math", "--data-dir", str(d / "records"),
            "--no-progress", *extra]


def _finetune(d: Path, *extra: str, records: str = "sft_no_output.json",
              parent: Path | None = None, workdir: Path | None = None) -> list[str]:
    if extra and not extra[0].startswith("--"):
        records, extra = extra[0], extra[1:]
    return ["finetune", str(parent or d / "run"), "--records", str(d / records), "--workdir",
            str(workdir or d / "ft"), "--no-progress", *extra]


def _generate(d: Path, *extra: str) -> list[str]:
    return ["generate", _run(d), "--no-progress", *extra]


def _sft(d: Path, records: str, *extra: str) -> list[str]:
    return ["data", "sft", str(d / records), "--run", _run(d), "--quiet", *extra]


def _lm_eval(d: Path, model_args: str) -> list[str]:
    return ["lm-eval", "--model", "depthbench", "--model_args", model_args, "--tasks",
            "arc_easy", "--limit", "1"]


def _sweep(d: Path, spec: str, *extra: str, workdir: str = "sw") -> list[str]:
    return ["sweep", "--config", spec if "/" in spec or not spec.endswith(".py")
            else str(d / spec), "--workdir", str(d / workdir), *extra]


def _coordcheck(d: Path, *extra: str) -> list[str]:
    return ["coordcheck", "--families", "pre_ln", "--depths", "2,4", "--widths", "32",
            "--steps", "1", "--quiet", *extra]


LOOP = r"is a symbolic-link loop; give a path whose links end somewhere"


OUT_OF_REACH = r"--budget: a total budget of 1e\+30 parameters is out of reach at depth 16"


A_FILE = r"'\S+/a_file' is a file, not a directory$"


PLAIN_NAME = r"--name: expected a name without path components \(no '/' or '\\', not '\.' or"


# Counts given as something else: (argv(disk, *option), option, value); the line is
# `--option: expected a positive integer, got 'value'`, said by the parser.
NOT_COUNTS = [
    (lambda d, *o: ["shapes", "--budget", "400M", "--depths", "16", *o], "--kv-heads", "0"),
    (lambda d, *o: ["shapes", "--suite", "micro", *o], "--vocab", "1.5"),
    (lambda d, *o: ["costs", "--suite", "micro", *o], "--seq-len", "-5"),
    (lambda d, *o: ["families", *o], "--depth", "x"),
    (lambda d, *o: _sweep(d, "quickstart", *o), "--max-runs", "-1"),
    (lambda d, *o: _sweep(d, "quickstart", *o), "--max-runs", "two"),
    (_analyze, "--chunk", "0"),
    (_analyze, "--window-chunk", "-1"),
    (_analyze, "--jacobian-windows", "-2"),
    (_analyze, "--windows", "x"),
    (_nll, "--batch-size", "0"),
    (_nll, "--max-length", "0"),
    (_nll, "--limit", "0"),
    (lambda d, *o: _sft(d, "sft_ok.jsonl", *o), "--max-seq-len", "0"),
    (lambda d, *o: _sft(d, "sft_ok.jsonl", *o), "--max-samples", "-3"),
]


def _sampled(d: Path, *extra: str) -> list[str]:
    return _generate(d, "--prompt", "x", "--temperature", "1", *extra)


SEEDS = r"an integer in \[0, 4294967295\]"  # what jax's key takes as given


# Integers past their range, as the parser says it: (argv(disk, *option), option, value,
# what is allowed); the line is `--option: expected WHAT, got 'value'`.
OUT_OF_RANGE = [
    (_sampled, "--seed", str(2**32), SEEDS),
    (_sampled, "--seed", "99999999999999999999999", SEEDS),
    (_sampled, "--seed", "-1", SEEDS),
    (lambda d, *o: _sft(d, "sft_ok.jsonl", *o), "--seed", "-1", "an integer >= 0"),
    (lambda d, *o: _sft(d, "sft_ok.jsonl", *o), "--seed", "1e3", "an integer >= 0"),
]


# (id, argv(disk), pattern of the one stderr line)
CASES = [
    *((f"{argv(Path('d'))[0]}: {option} {value}", lambda d, a=argv, o=option, v=value: a(d, o, v),
       rf"^depthbench: error: {option}: expected a positive integer, got '{re.escape(value)}'$")
      for argv, option, value in NOT_COUNTS),
    *((f"{' '.join(argv(Path('d'))[:2 if argv(Path('d'))[0] == 'data' else 1])}: {option} "
       f"{value}", lambda d, a=argv, o=option, v=value: a(d, o, v),
       rf"^depthbench: error: {option}: expected {allowed}, got '{re.escape(value)}'$")
      for argv, option, value, allowed in OUT_OF_RANGE),
    # ------------------------------------------------------------- the parser
    ("an option but no command", lambda d: ["--bogus"],
     r"^depthbench: error: unrecognized arguments: --bogus; give a COMMAND first"),
    ("data without an action", lambda d: ["data"],
     r"^depthbench: error: data: the following arguments are required: ACTION$"),
    ("import-olmo without --out", lambda d: ["import-olmo", str(d / "empty")],
     r"^depthbench: error: import-olmo: the following arguments are required: --out$"),
    # ----------------------------------------------------------------- shapes
    ("shapes: a budget no shape reaches", lambda d: ["shapes", "--budget", "1e30", "--depths",
                                                     "16"], OUT_OF_REACH),
    ("shapes: --fix not a choice", lambda d: ["shapes", "--budget", "400M", "--depths", "16",
                                              "--fix", "sideways"],
     r"--fix: invalid choice: 'sideways' \(choose from 'total', 'backbone'\)$"),
    ("shapes: heads that do not split a suite's width",
     lambda d: ["shapes", "--suite", "micro", "--heads", "7"],
     r"--heads: 7 heads must split d_model 152 into even head dimensions$"),
    ("shapes: an infinite budget", lambda d: ["shapes", "--budget", "inf", "--depths", "16"],
     r"--budget: expected a positive parameter count like 400M, 1\.6B or 4e8, got 'inf'$"),
    # ------------------------------------------------------------------ costs
    ("costs: a budget no shape reaches", lambda d: ["costs", "--budget", "1e30", "--depths",
                                                    "16", "--seq-len", "128"], OUT_OF_REACH),
    ("costs: an empty --family", lambda d: ["costs", "--suite", "micro", "--seq-len", "64",
                                            "--family", ""],
     r"--family: '' is not one of pre_ln, .*, all$"),
    ("costs: a depth the suite lacks", lambda d: ["costs", "--suite", "micro", "--seq-len",
                                                  "64", "--depths", "99"],
     r"--depths: suite 'micro' has no depth 99; allowed: "),
    # --------------------------------------------------------------- families
    ("families: --d-model negative", lambda d: ["families", "--d-model", "-32"],
     r"--d-model: expected a positive multiple of 32, got '-32'$"),
    ("families: --d-model in exponent form", lambda d: ["families", "--d-model", "1e3"],
     r"--d-model: expected a positive multiple of 32, got '1e3'$"),
    # ------------------------------------------------------------------ train
    ("train: an empty --workdir", lambda d: ["train", "--config", "base", "--workdir", ""],
     r"--workdir: expected a directory, got ''$"),
    ("train: --workdir under a file", lambda d: ["train", "--config", "base", "--workdir",
                                                 str(d / "a_file" / "run")],
     r"--workdir: '\S+/a_file/run': " + A_FILE),
    ("train: --config a directory", lambda d: ["train", "--config", str(d / "empty"),
                                               "--workdir", str(d / "new")],
     r"config: spec file '\S+/empty' does not exist, and it names none of the bundled specs"),
    ("train: --workdir a link loop", lambda d: ["train", "--config", "base", "--workdir",
                                                str(d / "loop_a")],
     r"--workdir: '\S+/loop_a' " + LOOP + "$"),
    ("train: a W&B mode that is none (dry run)",
     lambda d: ["train", "--config", "base", "--workdir", str(d / "new"), "--dry-run",
                "--config.train.wandb=cloud"],
     r"config\.train\.wandb: 'cloud' is not one of '', 'offline', 'online'$"),
    # ------------------------------------------------------------------ sweep
    ("sweep: --workdir a link loop (dry run)",
     lambda d: _sweep(d, "quickstart", "--dry-run", workdir="loop_a"),
     r"--workdir: '\S+/loop_a' " + LOOP + "$"),
    ("sweep: a W&B mode that is none (dry run)",
     lambda d: _sweep(d, "sweep_two.py", "--dry-run", "--config.train.wandb=cloud"),
     r"sweep run 0 \(seed0\): config\.train\.wandb: 'cloud' is not one of '', 'offline', "
     r"'online'$"),
    ("sweep: --workdir a file (dry run)",
     lambda d: _sweep(d, "quickstart", "--dry-run", workdir="a_file"),
     r"--workdir: '\S+/a_file' exists and is not a directory$"),
    ("sweep: --workdir a file", lambda d: _sweep(d, "quickstart", workdir="a_file"),
     r"--workdir: '\S+/a_file' exists and is not a directory$"),
    ("sweep: --workdir under a file",
     lambda d: _sweep(d, "quickstart", "--dry-run", workdir="a_file/sweep"), "--workdir: "
     + r"'\S+/a_file/sweep': " + A_FILE),
    ("sweep: get_config() raises", lambda d: _sweep(d, "sweep_get_config_raises.py", "--list"),
     r"config: get_config\(\) in '\S+' failed: KeyError: 'model'$"),
    *((f"sweep: {what}", lambda d, spec=spec: _sweep(d, spec, "--list"), pattern)
      for spec, _, what, pattern in BAD_SWEEP_SPECS),
    ("sweep: --only not an index", lambda d: _sweep(d, "sweep_two.py", "--only", "a", "--list"),
     r"--only: expected comma-separated run indices like 0,5, got 'a'$"),
    # ----------------------------------------------------------------- report
    ("report: a file", lambda d: ["report", str(d / "a_file")],
     r"report: '\S+/a_file' is a file; give a sweep or run directory$"),
    ("report: results.csv not text", lambda d: ["report", str(d / "sweep_bytes"), "--no-plots"],
     r"report: '\S+/results\.csv' is not a depthbench results\.csv: 'utf-8' codec"),
    ("report: results.csv without its columns",
     lambda d: ["report", str(d / "sweep_columns"), "--no-plots"],
     r"report: '\S+/results\.csv' lacks columns aspect_ratio, depth, final_val_loss, lr$"),
    ("report: a sweep without results.csv",
     lambda d: ["report", str(d / "sweep_manifest_only"), "--no-plots"],
     r"report: '\S+/results\.csv' does not exist; run `depthbench sweep --workdir \S+` first$"),
    # ---------------------------------------------------------------- analyze
    ("analyze: one-token windows", lambda d: _analyze(d, "--seq-len", "1"),
     r"--windows/--seq-len: need >= 1 window of >= 2 tokens, got 4 x 1$"),
    ("analyze: more windows than the split holds", lambda d: _analyze(d, "--windows", "400"),
     r"--windows: the validation split \(1200 tokens\) holds only 75 windows of 16 tokens; "
     r"ask for fewer$"),
    ("analyze: an unknown metric", lambda d: _analyze(d, "--metrics", "depthiness"),
     r"--metrics: depthiness not one of angular_distance, "),
    ("analyze: --causal-ratio not a choice", lambda d: _analyze(d, "--causal-ratio", "median"),
     r"--causal-ratio: invalid choice: 'median' \(choose from"),
    ("analyze: a directory without a run", lambda d: ["analyze", str(d / "empty")],
     r"RUN_DIR '\S+/empty' is not a run directory \(no config\.json naming model\.family\)"),
    ("analyze: --compare a run never analysed",
     lambda d: ["analyze", "--compare", _run(d), "--out", str(d / "cmp.png")],
     r"--compare: \S+/run has no analysis/analysis\.json; run `depthbench analyze"),
    ("analyze: --compare an unknown metric",
     lambda d: ["analyze", "--compare", _run(d), "--metric", "loss"],
     r"--metric: 'loss' not one of angular_distance, "),
    ("analyze: --compare --out a directory",
     lambda d: ["analyze", "--compare", _run(d), "--out", str(d / "empty")],
     r"--out: '\S+/empty' is a directory; give a file name"),
    # ------------------------------------------------------------- coordcheck
    # Every output is checked before the first model trains.
    ("coordcheck: --out a directory", lambda d: _coordcheck(d, "--out", str(d / "empty")),
     r"--out: '\S+/empty' is a directory; give a file name \(a new file, or one to replace\)$"),
    ("coordcheck: --json a directory",
     lambda d: _coordcheck(d, "--no-plot", "--json", str(d / "empty")),
     r"--json: '\S+/empty' is a directory; give a file name"),
    ("coordcheck: --out in a missing directory",
     lambda d: _coordcheck(d, "--out", str(d / "no_dir" / "cc.png")),
     r"--out: directory '\S+/no_dir' does not exist; create it first$"),
    ("coordcheck: --json under a file",
     lambda d: _coordcheck(d, "--no-plot", "--json", str(d / "a_file" / "cc.json")),
     r"--json: '\S+/a_file/cc\.json': '\S+/a_file' is a file, not a directory$"),
    ("coordcheck: --json a link loop",
     lambda d: _coordcheck(d, "--no-plot", "--json", str(d / "loop_a")),
     r"--json: '\S+/loop_a' " + LOOP + "$"),
    # ---------------------------------------------------------------- imports
    ("import-hf: --out a link loop",
     lambda d: ["import-hf", str(d / "empty"), "--out", str(d / "loop_a")],
     r"import-hf: --out: '\S+/loop_a' " + LOOP + "$"),
    # --------------------------------------------------------------- data sft
    ("data sft: a record without its output",
     lambda d: ["data", "sft", str(d / "sft_no_output.json"), "--run", _run(d), "--quiet"],
     r"RECORDS: \S+/sft_no_output\.json record 0 has no 'output' field \(it has: "
     r"instruction\); instruction records name instruction, input \(optional\), output$"),
    ("data sft: no records",
     lambda d: ["data", "sft", str(d / "sft_empty.jsonl"), "--run", _run(d), "--quiet"],
     r"RECORDS: \S+/sft_empty\.jsonl holds no records$"),
    ("data sft: a parent that is not a run",
     lambda d: ["data", "sft", str(d / "sft_no_output.json"), "--run", str(d / "empty")],
     r"data sft: RUN_DIR '\S+/empty' is not a run directory"),
    ("data sft: records that are not a file",
     lambda d: ["data", "sft", str(d / "empty"), "--run", _run(d)],
     r"RECORDS: '\S+/empty' is not a file$"),
    ("data sft: a lone surrogate in a record", lambda d: _sft(d, "sft_surrogate.jsonl"),
     r"RECORDS: \S+/sft_surrogate\.jsonl record 0 \(line 1\) field 'instruction' is not "
     r"valid Unicode \(a lone surrogate U\+D800 at character 1\)$"),
    ("data sft: NaN in a record", lambda d: _sft(d, "sft_nan.jsonl"),
     r"RECORDS: \S+/sft_nan\.jsonl line 1 is not JSON \(NaN is not a JSON value\); expected "
     r"one JSON object per line$"),
    ("data sft: lines end at \\n only (U+2028 is text)",
     lambda d: _sft(d, "sft_after_u2028.jsonl"),
     r"RECORDS: \S+/sft_after_u2028\.jsonl record 1 \(line 2\) has no 'output' field"),
    ("data sft: a prompt too long for --max-seq-len", lambda d: _sft(d, "sft_ok.jsonl",
                                                                     "--max-seq-len", "8"),
     r"--max-seq-len 8: record \d's prompt alone is \d+ tokens, so the original's truncation "
     r"leaves no response token; raise --max-seq-len or drop the record$"),
    # --------------------------------------------------------------- finetune
    ("finetune: a record without its output", lambda d: _finetune(d, "sft_no_output.json"),
     r"--records: \S+/sft_no_output\.json record 0 has no 'output' field \(it has: "
     r"instruction\); instruction records name instruction, input \(optional\), output$"),
    ("finetune: no records", lambda d: _finetune(d, "sft_empty.jsonl"),
     r"--records: \S+/sft_empty\.jsonl holds no records$"),
    ("finetune: a parent that is not a run", lambda d: _finetune(d, parent=d / "empty"),
     r"finetune: RUN_DIR '\S+/empty' is not a run directory \(no config\.json naming "
     r"model\.family\); give one written by train, finetune, import-olmo or import-hf$"),
    ("finetune: --workdir not empty and no run", lambda d: _finetune(d, workdir=d / "records"),
     r"--workdir: '\S+/records' exists and is not empty and holds no run; give a new or "
     r"empty directory$"),
    ("finetune: --workdir another run", lambda d: _finetune(d, workdir=d / "run_mix_ln"),
     r"--workdir: '\S+/run_mix_ln' holds another run \(not a fine-tuning of \S+/run\); "
     r"give a new directory$"),
    ("finetune: --workdir the parent", lambda d: _finetune(d, workdir=d / "run"),
     r"--workdir: '\S+/run' is the parent run itself; give a new directory$"),
    ("finetune: an override of the parent's model",
     lambda d: _finetune(d, "--config.model.depth=3"),
     r"--config\.model\.depth: a fine-tuned run keeps its parent's model and tokenizer; of "
     r"model\.\* and data\.\* only compute_dtype, .* may be set$"),
    # An override is a statement, checked by its presence: one equal to the sft spec's
    # default (depth 4, pre_ln) is refused as any other, never silently dropped.
    ("finetune: an override of the parent's model at the spec's default",
     lambda d: _finetune(d, "--config.model.depth=4"),
     r"--config\.model\.depth: a fine-tuned run keeps its parent's model and tokenizer"),
    ("finetune: the parent's own family given",
     lambda d: _finetune(d, "--config.model.family=pre_ln"),
     r"--config\.model\.family: a fine-tuned run keeps its parent's model and tokenizer"),
    ("finetune: the data digest set", lambda d: _finetune(d, "--config.finetune.data_digest=x"),
     r"--config\.finetune\.data_digest: set by depthbench finetune \(the parent's directory "
     r"and the prepared records' digest\)$"),
    ("finetune: a negative data seed",
     lambda d: _finetune(d, "sft_ok.jsonl", "--config.finetune.data_seed=-1"),
     r"config\.finetune\.data_seed: -1; want an integer >= 0$"),
    ("finetune: a lone surrogate in a record", lambda d: _finetune(d, "sft_surrogate.jsonl"),
     r"--records: \S+/sft_surrogate\.jsonl record 0 \(line 1\) field 'instruction' is not "
     r"valid Unicode \(a lone surrogate U\+D800 at character 1\)$"),
    ("finetune: packed with the cudnn attention",
     lambda d: _finetune(d, "--config.finetune.layout=packed",
                         "--config.model.attention_impl=cudnn"),
     r"config\.finetune\.layout: 'packed' keeps records apart with model\.attention_impl "
     r"'xla' only, not 'cudnn'$"),
    ("train: a fine-tuning's config",
     lambda d: ["train", "--config", "base", "--workdir", str(d / "new"),
                f"--config.finetune.parent={_run(d)}"],
     r"config\.finetune\.parent: a fine-tuning run is started by `depthbench finetune "
     r"PARENT_RUN --records FILE`, not by train$"),
    # ---------------------------------------------------------------- exports
    ("export-olmo without --out", lambda d: ["export-olmo", _run(d)],
     r"^depthbench: error: export-olmo: the following arguments are required: --out$"),
    ("export-olmo: a family the original never trained",
     lambda d: ["export-olmo", str(d / "run_mix_ln"), "--out", str(d / "step")],
     r"export-olmo: mix_ln is not a design the original DepthBench trained, so its format has "
     r"no block for it; exportable families: pre_ln, .*lns.*$"),
    ("export-olmo: a configuration the original never trained",
     lambda d: ["export-olmo", str(d / "run_lns_quarter"), "--out", str(d / "step")],
     r"export-olmo: the original's LNS divides by sqrt\(l\); this lns has lns_power 0\.25$"),
    ("export-olmo: RUN_DIR not a run",
     lambda d: ["export-olmo", str(d / "empty"), "--out", str(d / "step")],
     r"export-olmo: RUN_DIR '\S+/empty' is not a run directory \(no config\.json naming "
     r"model\.family\); give one written by train, finetune, import-olmo or import-hf$"),
    ("export-olmo: --out a file",
     lambda d: ["export-olmo", _run(d), "--out", str(d / "a_file")],
     r"export-olmo: --out '\S+/a_file' is a file; give a new \(or empty\) directory$"),
    ("export-olmo: --out exists and is not empty",
     lambda d: ["export-olmo", _run(d), "--out", str(d / "records")],
     r"export-olmo: --out '\S+/records' exists and is not empty; use a new directory$"),
    ("export-olmo: --out a link loop",
     lambda d: ["export-olmo", _run(d), "--out", str(d / "loop_a")],
     r"export-olmo: --out: '\S+/loop_a' " + LOOP + "$"),
    ("export-hf: a family other than the baseline",
     lambda d: ["export-hf", str(d / "run_mix_ln"), "--out", str(d / "hf")],
     r"export-hf: a mix_ln run is not a Llama \(only pre_ln runs, the plain LLaMA decoder, "
     r"are\); export-olmo writes the original DepthBench's format$"),
    ("export-hf: --out exists and is not empty",
     lambda d: ["export-hf", _run(d), "--out", str(d / "records")],
     r"export-hf: --out '\S+/records' exists and is not empty; use a new directory$"),
    ("import-olmo: --out a link loop",
     lambda d: ["import-olmo", str(d / "empty"), "--out", str(d / "loop_a")],
     r"import-olmo: --out: '\S+/loop_a' " + LOOP + "$"),
    ("import-olmo: --out under a link loop",
     lambda d: ["import-olmo", str(d / "empty"), "--out", str(d / "loop_b" / "run")],
     r"import-olmo: --out: '\S+/loop_b/run' " + LOOP + "$"),
    # ------------------------------------------------------------------- eval
    ("eval: a batch no memory holds", lambda d: _nll(d, "--batch-size", str(10**9)),
     r"--batch-size: 1000000000 sequences of 16 tokens need \d+ GiB for their logits alone "
     r"\(vocabulary 320\); the devices have \d+ GiB: lower the batch size$"),
    ("eval: --name with path components", lambda d: _nll(d, "--name", "../../x"),
     PLAIN_NAME + r" '\.\.'\), got '\.\./\.\./x'$"),
    ("eval: an empty --name", lambda d: _nll(d, "--name", ""), PLAIN_NAME + r" '\.\.'\), got ''$"),
    ("eval: --name .", lambda d: _nll(d, "--name", "."), PLAIN_NAME + r" '\.\.'\), got '\.'$"),
    ("eval: --step negative", lambda d: _nll(d, "--step", "-1"),
     r"--step: expected an integer >= 0, got '-1'$"),
    ("eval: --step not checkpointed", lambda d: _nll(d, "--step", "3"),
     r"--step: 3 is not one of the checkpointed steps \[7\]$"),
    ("eval: --num-fewshot negative", lambda d: ["eval", _run(d), "--tasks", "arc_easy",
                                                "--num-fewshot", "-1"],
     r"--num-fewshot: expected an integer >= 0, got '-1'$"),
    ("eval: --num-fewshot with the NLL suite", lambda d: _nll(d, "--num-fewshot", "2"),
     r"--num-fewshot: applies only to the lm-eval suites and --tasks$"),
    ("eval: --include-path with the NLL suite",
     lambda d: _nll(d, "--include-path", str(d / "empty")),
     r"--include-path: applies only to the lm-eval suites and --tasks$"),
    ("eval: --data-dir with --tasks", lambda d: ["eval", _run(d), "--tasks", "arc_easy",
                                                 "--data-dir", str(d / "records")],
     r"--data-dir: applies only to --suite nll-code-stem-math$"),
    ("eval: --include-path missing, with --tasks",
     lambda d: ["eval", _run(d), "--tasks", "arc_easy", "--include-path", str(d / "my_tasks")],
     r"--include-path: '\S+/my_tasks' does not exist$"),
    ("eval: --include-path missing, with a suite",
     lambda d: ["eval", _run(d), "--suite", "commonsense", "--include-path",
                str(d / "my_tasks")], r"--include-path: '\S+/my_tasks' does not exist$"),
    ("eval: --only a task of no suite", lambda d: _nll(d, "--only", "trivia"),
     r"--only: 'trivia' is not a task of nll-code-stem-math; allowed: mbpp, "),
    ("eval: --only with an lm-eval suite", lambda d: ["eval", _run(d), "--suite", "commonsense",
                                                      "--only", "mbpp"],
     r"--only: picks tasks of --suite nll-code-stem-math; use --tasks for lm-eval$"),
    ("eval: an unknown suite", lambda d: ["eval", _run(d), "--suite", "trivia"],
     r"--suite: 'trivia' is unknown; allowed: nll-code-stem-math, commonsense, bbh-reasoning$"),
    ("eval: --data-dir without the records",
     lambda d: ["eval", _run(d), "--suite", "nll-code-stem-math", "--data-dir", str(d / "empty")],
     r"--data-dir: \S+/empty/mbpp\.jsonl \(or \.parquet\) does not exist; put the mbpp records"),
    # --------------------------------------------------------------- generate
    ("generate: a prompt longer than the window",
     lambda d: _generate(d, "--prompt", "word " * 40),
     r"--prompt: \d+ tokens \(with the document start\) are longer than the run's window of "
     r"32 \(train\.seq_len\)$"),
    ("generate: --max-new-tokens 0",
     lambda d: _generate(d, "--prompt", "x", "--max-new-tokens", "0"),
     r"--max-new-tokens: expected a positive integer, got '0'$"),
    ("generate: --max-new-tokens past the window",
     lambda d: _generate(d, "--prompt", "x", "--max-new-tokens", "33"),
     r"--max-new-tokens: 33 is past the run's window of 32 tokens \(train\.seq_len\)$"),
    ("generate: a negative temperature",
     lambda d: _generate(d, "--prompt", "x", "--temperature", "-0.5"),
     r"--temperature: expected a number >= 0, got '-0\.5'$"),
    ("generate: --top-p 0", lambda d: _generate(d, "--prompt", "x", "--top-p", "0"),
     r"--top-p: expected a number in \(0, 1\], got '0'$"),
    ("generate: --top-p above 1", lambda d: _generate(d, "--prompt", "x", "--top-p", "1.5"),
     r"--top-p: expected a number in \(0, 1\], got '1\.5'$"),
    ("generate: a negative --top-k", lambda d: _generate(d, "--prompt", "x", "--top-k", "-1"),
     r"--top-k: expected an integer >= 0, got '-1'$"),
    ("generate: a prompts file that is not JSON lines",
     lambda d: _generate(d, "--prompts", str(d / "prompts_text.jsonl")),
     r"--prompts: '\S+/prompts_text\.jsonl' line 1 is not JSON \(.+\); expected one JSON "
     r"object per line$"),
    ("generate: a prompts file without the field",
     lambda d: _generate(d, "--prompts", str(d / "prompts_no_field.jsonl")),
     r"--prompts: '\S+' line 1 has no field 'prompt' \(--field names the prompt's field; the "
     r"record has 'text'\)$"),
    ("generate: a prompts file that does not exist",
     lambda d: _generate(d, "--prompts", str(d / "no_prompts.jsonl")),
     r"--prompts: '\S+/no_prompts\.jsonl' does not exist; give a JSON-lines file$"),
    ("generate: an empty prompt", lambda d: _generate(d, "--prompt", ""),
     r"--prompt: empty; give the text to continue$"),
    ("generate: a prompt that is not valid Unicode",  # bytes not UTF-8 in argv: surrogateescape
     lambda d: _generate(d, "--prompt", "a\udcffb"),
     r"--prompt is not valid Unicode \(a lone surrogate U\+DCFF at character 1\)$"),
    ("generate: a lone surrogate in the prompts file",
     lambda d: _generate(d, "--prompts", str(d / "prompts_surrogate.jsonl")),
     r"--prompts: '\S+' line 1: the prompt \('prompt'\) is not valid Unicode \(a lone "
     r"surrogate U\+D800 at character 1\)$"),
    ("generate: NaN in a prompt's record",  # it would be copied into --out as non-JSON
     lambda d: _generate(d, "--prompts", str(d / "prompts_nan.jsonl"), "--out",
                         str(d / "out.jsonl")),
     r"--prompts: '\S+' line 1 is not JSON \(NaN is not a JSON value\); expected one JSON "
     r"object per line$"),
    ("generate: lines end at \\n only (U+2028 is text)",
     lambda d: _generate(d, "--prompts", str(d / "prompts_after_u2028.jsonl")),
     r"--prompts: '\S+' line 2 has no field 'prompt' \(--field names the prompt's field; the "
     r"record has 'text'\)$"),
    ("generate: an empty prompt in the file",
     lambda d: _generate(d, "--prompts", str(d / "prompts_empty.jsonl")),
     r"--prompts: '\S+' line 1: the prompt \('prompt'\) is empty$"),
    ("generate: no prompt at all", lambda d: _generate(d),
     r"generate: one of the arguments --prompt --prompts is required$"),
    ("generate: a directory that is not a run",
     lambda d: ["generate", str(d / "empty"), "--prompt", "x"],
     r"RUN_DIR '\S+/empty' is not a run directory \(no config\.json naming model\.family\)"),
    ("generate: --out a directory",
     lambda d: _generate(d, "--prompt", "x", "--out", str(d / "empty")),
     r"--out: '\S+/empty' is a directory; give a file name"),
    # ---------------------------------------------------------------- lm-eval
    ("lm-eval: an unknown model arg", lambda d: _lm_eval(d, f"run={_run(d)},temperature=0"),
     r"--model_args: 'temperature' is not an argument of the depthbench model; allowed: run, "),
    ("lm-eval: batch_size=0", lambda d: _lm_eval(d, f"run={_run(d)},batch_size=0"),
     r"--model_args: batch_size: expected a positive integer, got '0'$"),
    ("lm-eval: batch_size=auto:0", lambda d: _lm_eval(d, f"run={_run(d)},batch_size=auto:0"),
     r"--model_args: batch_size: expected a positive integer, got '0'$"),
    ("lm-eval: max_length not a number", lambda d: _lm_eval(d, f"run={_run(d)},max_length=abc"),
     r"--model_args: max_length: expected a positive integer, got 'abc'$"),
    ("lm-eval: add_bos_token not a flag",
     lambda d: _lm_eval(d, f"run={_run(d)},add_bos_token=maybe"),
     r"--model_args: add_bos_token: expected true or false, got 'maybe'$"),
    ("lm-eval: batch_size in exponent form", lambda d: _lm_eval(d, f"run={_run(d)},batch_size=1e9"),
     r"--model_args: batch_size: expected a positive integer, got '1e9'$"),
    ("lm-eval: batch_size beyond memory",
     lambda d: _lm_eval(d, f"run={_run(d)},batch_size={10**9}"),
     r"--model_args: batch_size: 1000000000 sequences of 16 tokens need \d+ GiB for their "
     r"logits alone"),
    ("lm-eval: max_gen_toks beyond the context",
     lambda d: _lm_eval(d, f"run={_run(d)},max_length=24,max_gen_toks=24"),
     r"--model_args: max_gen_toks: 24 must be below max_length 24 \(the context the model "
     r"sees\)$"),
    ("lm-eval: step not checkpointed", lambda d: _lm_eval(d, f"run={_run(d)},step=3"),
     r"--model_args: step: 3 is not one of the checkpointed steps \[7\]$"),
    ("lm-eval: an unknown task",
     lambda d: ["lm-eval", "--model", "depthbench", "--model_args", f"run={_run(d)}",
                "--tasks", "no_such_task"],
     r"^depthbench: error: lm-eval: Tasks not found: no_such_task$"),
    ("lm-eval: no run", lambda d: _lm_eval(d, "step=7"),
     r"--model_args: run=RUN_DIR is required for the depthbench model$"),
    ("lm-eval: a run that is not one", lambda d: _lm_eval(d, f"run={d / 'empty'}"),
     r"RUN_DIR '\S+/empty' is not a run directory \(no config\.json naming model\.family\)"),
]


def _dry_train(d: Path) -> list[str]:
    return ["train", "--config", "base", "--workdir", str(d / "new"), "--dry-run"]


# The environment variables the package reads, each read where its value is checked:
# (id, variables(disk), argv(disk), pattern of the one stderr line).
ENV_CASES = [
    # $DEPTHBENCH_FAMILIES is read when the package is imported: tests/unit runs its
    # modules through registry.load_plugins, tests/integration in real processes.
    ("DEPTHBENCH_FAMILIES: a module that does not exist",
     lambda d: {"DEPTHBENCH_FAMILIES": "no_such_family_module"}, lambda d: ["families"],
     r"\$DEPTHBENCH_FAMILIES: no module named 'no_such_family_module'; is its directory on "
     r"PYTHONPATH\?$"),
    ("DEPTHBENCH_FAMILIES: a module that raises on import",
     lambda d: {"DEPTHBENCH_FAMILIES": "family_raises"}, lambda d: ["families"],
     r"\$DEPTHBENCH_FAMILIES: module 'family_raises' failed on import: RuntimeError: no "
     r"families today$"),
    ("DEPTHBENCH_FAMILIES: a module registering pre_ln again",
     lambda d: {"DEPTHBENCH_FAMILIES": "family_takes_pre_ln"}, lambda d: ["families"],
     r"\$DEPTHBENCH_FAMILIES: module 'family_takes_pre_ln' failed on import: ValueError: "
     r"register: a family named 'pre_ln' is already registered$"),
    ("DEPTHBENCH_FAMILIES: a module registering its name twice",
     lambda d: {"DEPTHBENCH_FAMILIES": "family_twice"}, lambda d: ["families"],
     r"\$DEPTHBENCH_FAMILIES: module 'family_twice' failed on import: ValueError: register: "
     r"a family named 'twice' is already registered$"),
    ("DEPTHBENCH_FAMILIES: a file, not a module",
     lambda d: {"DEPTHBENCH_FAMILIES": str(d / "plugins" / "family_raises.py")},
     lambda d: ["families"],
     r"\$DEPTHBENCH_FAMILIES: '\S+/family_raises\.py' is not a module name; expected "
     r"comma-separated importable modules"),
    ("DEPTHBENCH_OVERRIDES: an unclosed quote",
     lambda d: {"DEPTHBENCH_OVERRIDES": 'train.steps=3 data.paths="oops'}, _dry_train,
     r"\$DEPTHBENCH_OVERRIDES: no closing quotation in 'train\.steps=3 data\.paths=\"oops'; "
     r"expected section\.field=value words, quoted as in a shell$"),
    ("DEPTHBENCH_OVERRIDES: no field", lambda d: {"DEPTHBENCH_OVERRIDES": "=3"}, _dry_train,
     r"\$DEPTHBENCH_OVERRIDES: '=3' is not section\.field=value$"),
    ("DEPTHBENCH_OVERRIDES: no value", lambda d: {"DEPTHBENCH_OVERRIDES": "train.steps"},
     _dry_train, r"\$DEPTHBENCH_OVERRIDES: 'train\.steps' is not section\.field=value$"),
    ("DEPTHBENCH_MAX_RUNS: not a count (dry run)", lambda d: {"DEPTHBENCH_MAX_RUNS": "abc"},
     lambda d: _sweep(d, "sweep_two.py", "--dry-run"),
     r"\$DEPTHBENCH_MAX_RUNS: expected a positive integer, got 'abc'$"),
    ("DEPTHBENCH_MAX_RUNS: zero", lambda d: {"DEPTHBENCH_MAX_RUNS": "0"},
     lambda d: _sweep(d, "sweep_two.py", "--no-progress"),
     r"\$DEPTHBENCH_MAX_RUNS: expected a positive integer, got '0'$"),
    ("DEPTHBENCH_CACHE: a file (dry run)", lambda d: {"DEPTHBENCH_CACHE": str(d / "a_file")},
     _dry_train, r"\$DEPTHBENCH_CACHE: \S+/a_file exists and is not a directory$"),
    ("DEPTHBENCH_CACHE: a file (data sft)", lambda d: {"DEPTHBENCH_CACHE": str(d / "a_file")},
     lambda d: _sft(d, "sft_ok.jsonl"),
     r"\$DEPTHBENCH_CACHE: \S+/a_file exists and is not a directory$"),
    ("DEPTHBENCH_CACHE: under a file (finetune)",
     lambda d: {"DEPTHBENCH_CACHE": str(d / "a_file" / "cache")},
     lambda d: _finetune(d, "sft_ok.jsonl"),
     r"\$DEPTHBENCH_CACHE: \S+/a_file is a file, so \S+/a_file/cache cannot be a directory$"),
    ("DEPTHBENCH_CACHE: a link loop (sweep)",
     lambda d: {"DEPTHBENCH_CACHE": str(d / "loop_a")},
     lambda d: _sweep(d, "sweep_two.py", "--no-progress"),
     r"\$DEPTHBENCH_CACHE: '\S+/loop_a' " + LOOP + "$"),
    ("DEPTHBENCH_MALLOC: not a choice", lambda d: {"DEPTHBENCH_MALLOC": "fast"},
     lambda d: ["families"],
     r"\$DEPTHBENCH_MALLOC: 'fast' is not one of system, mimalloc, keep$"),
    ("DEPTHBENCH_CPU_DOTS: not a choice", lambda d: {"DEPTHBENCH_CPU_DOTS": "mkl"},
     lambda d: ["families"],
     r"\$DEPTHBENCH_CPU_DOTS: 'mkl' is not one of auto, eigen, ynnpack$"),
    ("SLURM_NTASKS: not a count (dry run)",
     lambda d: {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "two"}, _dry_train,
     r"SLURM_NTASKS: expected a non-negative integer, got 'two'$"),
    ("OMPI_COMM_WORLD_SIZE: not a count (sweep)", lambda d: {"OMPI_COMM_WORLD_SIZE": "x"},
     lambda d: _sweep(d, "sweep_two.py", "--no-progress"),
     r"OMPI_COMM_WORLD_SIZE: expected a non-negative integer, got 'x'$"),
    ("JAX_PROCESS_ID: not below JAX_NUM_PROCESSES (dry run)",
     lambda d: {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, _dry_train,
     r"JAX_PROCESS_ID: 2 is not in \[0, JAX_NUM_PROCESSES=2\)$"),
]


# Environment cases read at import: in-process, the loader is called directly.
IMPORT_TIME = {c[0] for c in ENV_CASES if c[0].startswith("DEPTHBENCH_FAMILIES")}


# Environment cases run as real processes too.
ENV_PROCESS_CASES = IMPORT_TIME | {"DEPTHBENCH_OVERRIDES: an unclosed quote",
                                   "DEPTHBENCH_CPU_DOTS: not a choice"}


# Cases whose stderr is checked in a real process (logging configured as a user's is).
PROCESS_CASES = {"analyze: more windows than the split holds", "eval: --step not checkpointed",
                 "lm-eval: an unknown model arg", "generate: a prompt longer than the window"}


def unchanged(disk: Path, run) -> str:
    """Run ``run()``; the disk must be as it was (the data cache aside)."""
    before = snapshot(disk)
    err = run()
    assert snapshot(disk) == before, "the disk changed"
    return err


def one_line(code, out: str, err: str, pattern: str) -> None:
    assert code == 2, f"exit {code}\nstdout: {out[-2000:]}\nstderr: {err[-3000:]}"
    lines = err.splitlines()
    assert len(lines) == 1, f"stderr is {len(lines)} lines:\n{err[-3000:]}"
    assert lines[0].startswith("depthbench: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]


def snapshot(root: Path) -> dict[str, object]:
    """Every path under ``root`` with its size and SHA-256 (directories as such), the
    data cache aside: what a bad input must leave as it was."""
    snap: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel == "cache" or rel.startswith("cache/"):
            continue  # preparing good data may fill the cache: that is not damage
        snap[rel] = (
            (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) if p.is_file() else "dir"
        )
    return snap
