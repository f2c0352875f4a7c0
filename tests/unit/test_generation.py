"""Generation on a run (depthbench.generation, `depthbench generate`): the sampling
rules' known answers (a temperature or nucleus too small for float32 at its
limit), greedy decoding equal to recomputing the forward pass, why each
completion ended, sampling that depends on the seed alone, prompts files read
as JSON Lines, and --out on a read-only disk."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from analysis_tiny import tiny_config
from eval_tiny import tiny_run
from noisy_params import perturbed

from depthbench.cli import main as cli_main
from depthbench.generation.decoder import Decoder
from depthbench.generation.loop import generate
from depthbench.generation.sampling import GREEDY, Sampling, choose, filtered_logits
from depthbench.run import init_run

PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def _kept(sampling: Sampling) -> list[int]:
    logits = jnp.log(jnp.asarray(PROBS, jnp.float32))[None]
    return np.flatnonzero(np.isfinite(np.asarray(filtered_logits(logits, sampling))[0])).tolist()


def test_top_k_and_the_top_p_nucleus_keep_the_right_tokens():
    """The nucleus is the fewest most likely tokens holding top_p: 0.5 + 0.3
    reaches 0.8 (not 0.81); a token is kept while the mass before it is below top_p."""
    assert _kept(Sampling(1.0)) == [0, 1, 2, 3]
    assert _kept(Sampling(1.0, top_k=2)) == [0, 1]
    assert _kept(Sampling(1.0, top_p=0.5)) == [0]
    assert _kept(Sampling(1.0, top_p=0.8)) == [0, 1]
    assert _kept(Sampling(1.0, top_p=0.81)) == [0, 1, 2]
    assert _kept(Sampling(1.0, top_k=2, top_p=0.99)) == [0, 1]
    logits = jnp.asarray([[0.0, 2.0]])
    np.testing.assert_allclose(filtered_logits(logits, Sampling(2.0)), [[-1.0, 0.0]])  # top: 0
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampling(**bad)


def test_sampling_follows_the_softmax_and_depends_on_seed_step_and_row_only():
    rows = 4000
    logits = jnp.log(jnp.asarray(np.tile(PROBS, (rows, 1)), jnp.float32))
    ids = jnp.arange(rows, dtype=jnp.int32)
    draw = jax.jit(choose, static_argnums=1)
    tokens = np.asarray(draw(logits, Sampling(1.0), 7, 1, ids))
    np.testing.assert_allclose(np.bincount(tokens, minlength=4) / rows, PROBS, atol=0.03)
    np.testing.assert_array_equal(draw(logits, Sampling(1.0), 7, 1, ids), tokens)
    assert np.mean(np.asarray(draw(logits, Sampling(1.0), 8, 1, ids)) != tokens) > 0.3
    # Row 5 draws the same token whatever rows it shares the batch with.
    alone = draw(logits[:1], Sampling(1.0), 7, 1, ids[5:6])
    assert int(alone[0]) == int(tokens[5])
    assert (np.asarray(draw(logits, GREEDY, 7, 1, ids)) == 0).all()
    assert (np.asarray(draw(logits, Sampling(5.0, top_k=1), 7, 1, ids)) == 0).all()


def test_a_temperature_or_nucleus_too_small_for_float32_is_its_limit():
    """1e-45 is below float32's smallest normal (logits over it were inf, and the
    first token with a positive logit won): greedy.  1e-30 is normal: the logits
    shifted by their top stay finite, the top alone at 0.  A nucleus of 1e-45
    (0 in float32) keeps the most likely token."""
    rows = 64
    logits = jnp.log(jnp.asarray(np.tile(PROBS[::-1], (rows, 1)), jnp.float32))  # top: 3
    ids = jnp.arange(rows, dtype=jnp.int32)
    draw = jax.jit(choose, static_argnums=1)
    assert Sampling(1e-45).greedy and not Sampling(1e-30).greedy
    for sampling in (Sampling(1e-45), Sampling(1e-30), Sampling(1.0, top_p=1e-45)):
        assert (np.asarray(draw(logits, sampling, 7, 1, ids)) == 3).all(), sampling
    scaled = np.asarray(filtered_logits(logits[:1], Sampling(1e-30)))[0]
    assert np.isfinite(scaled).all() and scaled[3] == 0 and (scaled[:3] < -1e29).all()
    assert _kept(Sampling(1.0, top_p=1e-45)) == [0]


@pytest.fixture(scope="module")
def run():
    """A tiny random pre_ln run (window 32, vocabulary 64), far from uniform."""
    r = init_run(tiny_config("pre_ln", 2, **{"train.seq_len": 32}))
    return r.with_params(perturbed(jax.device_get(r.params), 1, 0.5))


PROMPTS = [[5, 9, 3, 11, 2, 40, 7], [1, 2], [33, 4, 18, 60, 12]]


def test_greedy_decoding_equals_recomputing_the_forward(run):
    """Each greedy token is the argmax of the full forward over the prompt and
    the tokens before it (one forward per row checks every step: it is causal)."""
    done, timing = generate(Decoder(run), PROMPTS, max_new=9, batch_size=2, progress=False)
    assert [c.stop_reason for c in done] == ["length"] * 3
    for prompt, c in zip(PROMPTS, done, strict=True):
        assert len(c.ids) == 9
        logits = run.logits(np.asarray([prompt + list(c.ids)]))[0]
        np.testing.assert_array_equal(np.argmax(logits[len(prompt) - 1:-1], -1), c.ids)
    assert timing.prompt_tokens == 14 and len(timing.first_token_seconds) == 2
    assert timing.new_tokens == 3 * 8 and timing.decode_tokens_per_second > 0


def test_each_completion_says_why_it_ended(run):
    decoder = Decoder(run)
    free, _ = generate(decoder, PROMPTS, max_new=6, batch_size=3, progress=False)

    def detok(ids):  # token ids as text: a stop string is an id's digits
        return " ".join(map(str, ids))

    stop = f"{free[2].ids[2]}"  # the third token of the third row
    eos = free[0].ids[3]  # the fourth token of the first row
    long = list(range(1, 30))  # 29 of the window's 32: 4 tokens fit
    done, _ = generate(decoder, [*PROMPTS, long], max_new=6, batch_size=4, progress=False,
                       eos_id=eos, stop=[stop], detokenize=detok)
    reasons = [c.stop_reason for c in done]
    assert reasons[0] == "eos" and list(done[0].ids) == list(free[0].ids[:3])
    assert reasons[2] == "stop" and done[2].text == detok(free[2].ids[:3]).split(stop)[0]
    assert reasons[3] == "window" and len(done[3].ids) == 32 - 29 + 1


def test_generate_command_writes_completions_deterministic_for_a_seed(tmp_path, capsys):
    """`depthbench generate` over a prompts file: each record with its completion;
    the same seed gives the same samples whatever the batch size."""
    run_dir = tiny_run(tmp_path / "run", seq_len=48)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question": q, "id": i}) + "\n" for i, q in enumerate(
        ["The sky is", "def add(a, b):", "Solve x + 1 = 2."])))
    outs = []
    for batch in ("3", "1"):
        out = tmp_path / f"out{batch}.jsonl"
        assert cli_main(["generate", str(run_dir), "--prompts", str(prompts), "--field",
                         "question", "--max-new-tokens", "8", "--temperature", "0.9",
                         "--top-k", "40", "--seed", "3", "--batch-size", batch, "--out",
                         str(out), "--no-progress"]) == 0
        outs.append([json.loads(line) for line in out.read_text().splitlines()])
    printed = capsys.readouterr().out
    assert "time to first token" in printed and "decode" in printed and "tok/s" in printed
    assert outs[0] == outs[1]
    assert [r["id"] for r in outs[0]] == [0, 1, 2]
    for r in outs[0]:
        assert r["stop_reason"] in ("eos", "length") and 0 <= r["new_tokens"] <= 8
        assert r["new_tokens"] == 8 or r["stop_reason"] == "eos"


def test_prompts_are_json_lines_split_at_newlines_only(tmp_path):
    """U+2028 and U+2029 inside a string (json.dumps with ensure_ascii=False writes
    them raw) are text, not line ends: each record keeps its prompt whole."""
    from argparse import Namespace

    from depthbench.cli.generate import read_prompts

    texts = ["one\u2028two", "three\u2029four\r", "five"]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\r\n"
                            for t in texts), encoding="utf-8")
    got = read_prompts(Namespace(prompt=None, prompts=str(path), field="prompt"))
    assert [p.text for p in got] == texts
    assert [p.where.rsplit(" ", 1)[-1] for p in got] == ["1", "2", "3"]


def test_out_on_a_read_only_disk_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """Exit 4, one line naming --out and what to do about a read-only disk (not
    "free space"), and no file or temporary twin left."""
    import errno

    from depthbench.rundir import io

    def read_only(path, text):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    run_dir = tiny_run(tmp_path / "run")
    monkeypatch.setattr(io, "atomic_write", read_only)
    out = tmp_path / "answers" / "out.jsonl"
    out.parent.mkdir()
    capsys.readouterr()
    assert cli_main(["generate", str(run_dir), "--prompt", "The", "--max-new-tokens", "2",
                     "--out", str(out), "--no-progress"]) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"depthbench: error: generate: could not write --out {out} (Read-only file system); "
        "nothing was written there: make it writable and re-run the same command"]
    assert list(out.parent.iterdir()) == []
