"""The ``depthbench`` model backend of lm-evaluation-harness (docs/EVAL.md, "The
lm-eval backend"): any run directory through :func:`depthbench.load_run` and the
:class:`~depthbench.evaluation.scoring.Scorer`, a ``TemplateLM`` so contexts and
continuations split into tokens as lm-eval's own backends split them.
Registers itself as ``depthbench`` on import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# lm-eval loads its built-in model names only into an empty registry: load them
# first, so that registering ours does not hide them (`depthbench lm-eval --model hf`).
import lm_eval.models  # noqa: F401
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from depthbench.evaluation.prefix import prefix_token_id
from depthbench.evaluation.scoring import Scorer

# What ``--model_args`` may set (``depthbench lm-eval`` refuses anything else).
MODEL_ARGS = ("run", "step", "batch_size", "max_length", "max_gen_toks", "add_bos_token")

# Runs loaded before lm-eval started (``depthbench lm-eval`` loads the run first,
# so that a bad or damaged run is one line before lm-eval prints anything).
_PRELOADED: dict[tuple[str, int | None], Any] = {}


def _step(step: Any) -> int | None:
    from depthbench.errors import ConfigError

    if step in (None, ""):
        return None
    try:
        return int(step)
    except ValueError:
        raise ConfigError(f"--model_args: step={step!r} is not a checkpoint step (an "
                          "integer)") from None


def preload(run: str, step: Any = None, batch_size: Any = 8, max_length: Any = None,
            max_gen_toks: Any = None):
    """Load ``run`` now (``load_run``: the integrity-checked restore) for the
    DepthbenchLM that lm-eval constructs later with the same ``run`` and ``step``,
    and check what that model will be asked to hold (ConfigError before lm-eval
    starts, not inside it)."""
    from depthbench.errors import ConfigError
    from depthbench.evaluation.scoring import check_batch_fits
    from depthbench.run import load_run

    key = (str(Path(run).expanduser().resolve()), _step(step))
    loaded = load_run(run, step=key[1])
    length = int(max_length or loaded.config.train.seq_len)
    check_batch_fits(loaded, _int_or_default(batch_size, 8), length)
    if max_gen_toks is not None and int(max_gen_toks) >= length:
        raise ConfigError(f"--model_args: max_gen_toks: {max_gen_toks} must be below "
                          f"max_length {length} (the context the model sees)")
    _PRELOADED[key] = loaded


def _open(run: Any, step: Any):
    """The Run of ``run`` (a Run, or a directory: preloaded, or loaded now)."""
    from depthbench.run import Run, load_run

    if isinstance(run, Run):
        return run
    key = (str(Path(run).expanduser().resolve()), _step(step))
    return _PRELOADED.pop(key, None) or load_run(run, step=key[1])


def _int_or_default(value: Any, default: int) -> int:
    if value in (None, "", "auto") or str(value).startswith("auto"):
        return default
    return int(value)


@register_model("depthbench")
class DepthbenchLM(TemplateLM):
    backend = "causal"

    def __init__(self, run: Any = None, batch_size: Any = 8, max_length: Any = None,
                 max_gen_toks: Any = 256, step: Any = None, add_bos_token: Any = False,
                 progress: bool = True, **unused: Any):
        super().__init__()
        from depthbench.errors import ConfigError

        if run is None:
            raise ConfigError("--model_args: run=RUN_DIR is required for the depthbench model")
        self.run = _open(run, step)
        self.tokenizer = self.run.tokenizer
        self.scorer = Scorer(self.run, batch_size=_int_or_default(batch_size, 8),
                             max_length=None if max_length in (None, "") else int(max_length))
        self._max_gen_toks = int(max_gen_toks)
        self.add_bos_token = str(add_bos_token).lower() in ("1", "true", "yes")
        self.progress = str(progress).lower() not in ("0", "false", "no")
        self.scorer.progress = self.progress

    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_id)

    @property
    def prefix_token_id(self) -> int:
        return prefix_token_id(self.tokenizer)

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self.scorer.batch_size

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.path

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        ids = self.tokenizer.encode(string)  # never adds specials: BOS is added here, if asked
        add = self.add_bos_token if add_special_tokens is None else add_special_tokens
        bos = self.tokenizer.bos_id
        if add and bos >= 0 and (not ids or ids[0] != bos):
            ids = [bos] + ids
        left = kwargs.get("left_truncate_len")
        return ids[-left:] if left else ids

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        self.scorer.progress = self.progress and not disable_tqdm
        out = []
        for (key, _, _), (logp, greedy, _) in zip(
                requests, self.scorer.loglikelihood(pairs, desc="loglikelihood"), strict=True):
            out.append((logp, greedy))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, (logp, greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        ids = [self.tok_encode(t, add_special_tokens=False) for t in texts]
        self.scorer.progress = self.progress and not disable_tqdm
        scores = self.scorer.rolling(ids, self.prefix_token_id, desc="loglikelihood_rolling")
        for text, score in zip(texts, scores, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), score)
        return scores

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        # Requests sharing generation settings run as one batched call.
        groups: dict[tuple, list[int]] = {}
        settings = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            kw = normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks)
            until = handle_stop_sequences(kw.pop("until", None), eos=eos or None)
            key = (tuple(until), int(kw["max_gen_toks"]))
            settings.append((context, key))
            groups.setdefault(key, []).append(i)
        out: list[str] = [""] * len(requests)
        for (until, max_new), idx in tqdm(groups.items(), desc="generate_until",
                                          disable=disable_tqdm or not self.progress):
            contexts = [self.tok_encode(settings[i][0]) or [self.prefix_token_id] for i in idx]
            self.scorer.progress = False
            texts = self.scorer.generate(contexts, max_new=max_new, stop=list(until),
                                         decode=self.tok_decode, eos_id=self.eot_token_id)
            for i, text in zip(idx, texts, strict=True):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def get_model_info(self) -> dict:
        s = self.run.spec
        return {"depthbench_run": str(self.run.run_dir), "family": s.family, "depth": s.depth,
                "d_model": s.d_model, "step": self.run.step}
