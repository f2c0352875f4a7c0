"""``analyze(run, windows) -> dict``: every metric of docs/spec/analysis.md, in its
output format.  The work is passes over chunks of windows (a captured baseline,
then skips, swaps and affine stand-ins ``K`` at a time under ``vmap``, and the
block Jacobians); a metric is computed only if asked for or needed by one."""

from __future__ import annotations

import dataclasses
import time
from itertools import combinations

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from depthbench.analysis import metrics as M
from depthbench.analysis import probes
from depthbench.analysis.names import CAUSAL_RATIOS, METRICS
from depthbench.config import ConfigError
from depthbench.model.blockwise import Blockwise

_NEEDS = {"late_layer_interaction": ("causal_score", "permutation_score"),
          "effective_depth": ("layer_pruning",)}


def resolve_metrics(names) -> list[str]:
    """The metrics to compute: ``names`` (all when empty) plus what they need."""
    names = list(names or METRICS)
    bad = [n for n in names if n not in METRICS]
    if bad:
        raise ConfigError(f"--metrics: {', '.join(bad)} not one of {', '.join(METRICS)}")
    for n in list(names):
        names += [d for d in _NEEDS.get(n, ()) if d not in names]
    return [m for m in METRICS if m in names]


def _rows(a) -> list:
    """A matrix as JSON rows, ``None`` for undefined (nan) entries."""
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.asarray(a)]


def _pad_rows(rows: np.ndarray, k: int) -> np.ndarray:
    """``rows`` repeated at the end up to ``k`` rows (one compiled shape per pass)."""
    return np.concatenate([rows, np.repeat(rows[-1:], k - len(rows), axis=0)])


def analyze(run, windows_bt, metrics=None, *, chunk: int = 8, window_chunk: int = 8,
            causal_ratio: str = "of_means", prune_threshold: float = M.PRUNE_THRESHOLD,
            jacobian_windows: int = 2, progress: bool = True) -> dict:
    """All requested metrics of ``run`` (a :class:`~depthbench.run.Run`)
    on ``windows_bt`` (int ``[N, T]``).  ``chunk``: interventions evaluated at
    once; ``window_chunk``: windows per forward pass."""
    t0 = time.time()
    wanted = resolve_metrics(metrics)
    _check_options(chunk, window_chunk, jacobian_windows, causal_ratio)
    windows = np.asarray(windows_bt, np.int32)
    plan = _Plan.make(run, windows.shape[0], set(wanted), chunk, window_chunk)
    with run.context():
        sums = _passes(run, windows, plan, progress)
        loss = float(sums["nll"] / sums["n_pred"])
        result = _summarise(sums, plan, loss, causal_ratio, prune_threshold)
        if "block_jacobian" in plan.want:
            result["block_jacobian"] = _jacobians(run, windows[:max(1, jacobian_windows)],
                                                  chunk=max(chunk, 16), progress=progress)
        if plan.do_useful:
            result["usefulness"] = _usefulness(run, windows, plan.win_slices, sums["fit"], loss,
                                               sums["n_pred"], chunk, progress)
        if "effective_depth" in plan.want:
            result["effective_depth"] = M.effective_depth(
                np.asarray(result["layer_pruning"]["loss"]), loss, prune_threshold)
        result.update(_routing(sums, plan))
    result = {k: result[k] for k in METRICS if k in result}
    result["meta"] = {"family": run.spec.family, "depth": plan.L, "d_model": run.spec.d_model,
                      "step": run.step, "run_dir": str(run.run_dir) if run.run_dir else None,
                      "windows": plan.n_win, "seq_len": int(windows.shape[1]), "loss": loss,
                      "metrics": wanted, "options": {**run.options, "causal_ratio": causal_ratio},
                      "chunk": chunk, "seconds": round(time.time() - t0, 2)}
    return result


def _check_options(chunk: int, window_chunk: int, jacobian_windows: int,
                   causal_ratio: str) -> None:
    """The command line checks these too; this is for callers in Python."""
    for flag, value in (("--chunk", chunk), ("--window-chunk", window_chunk),
                        ("--jacobian-windows", jacobian_windows)):
        if value < 1:
            raise ConfigError(f"{flag}: expected a positive integer, got {value}")
    if causal_ratio not in CAUSAL_RATIOS:
        raise ConfigError(f"--causal-ratio: {causal_ratio!r} not one of {', '.join(CAUSAL_RATIOS)}")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the passes compute: the metrics wanted, the window chunks, the
    skip and swap interventions and how many of each run at once."""

    want: frozenset
    L: int
    n_win: int
    win_slices: list
    do_skip: bool
    do_swap: bool
    do_useful: bool
    skip_rows: np.ndarray  # [L, L]: row l skips block l
    pairs: list  # the swapped pairs (i, j), i < j
    swap_rows: np.ndarray  # [max(pairs, 1), L]: row k runs the order with pair k swapped
    k_skip: int
    k_swap: int

    @classmethod
    def make(cls, run, n_win: int, want: set, chunk: int, window_chunk: int) -> _Plan:
        L = run.depth
        shards = int(np.prod([run.mesh.shape[a] for a in ("data", "fsdp")]))
        window_chunk = max(shards, (min(window_chunk, n_win) // shards) * shards)
        if n_win % window_chunk:
            raise ConfigError(f"--windows: {n_win} windows do not split into chunks of "
                              f"{window_chunk} (the mesh's {shards} batch shards); use a multiple")
        skip_rows = np.ones((L, L), bool)
        np.fill_diagonal(skip_rows, False)
        pairs = list(combinations(range(L), 2))
        swap_rows = np.tile(np.arange(L, dtype=np.int32), (max(len(pairs), 1), 1))
        for k, (i, j) in enumerate(pairs):
            swap_rows[k, [i, j]] = [j, i]
        return cls(want=frozenset(want), L=L, n_win=n_win,
                   win_slices=probes.chunks(n_win, window_chunk),
                   do_skip=bool(want & {"causal_score", "layer_pruning"}),
                   do_swap="permutation_score" in want, do_useful="usefulness" in want,
                   skip_rows=skip_rows, pairs=pairs, swap_rows=swap_rows,
                   k_skip=min(chunk, L), k_swap=min(chunk, max(len(pairs), 1)))

    @property
    def passes(self) -> int:
        """Forward passes over window chunks, for the progress bar."""
        per_chunk = (1 + self.do_skip * len(probes.chunks(self.L, self.k_skip))
                     + self.do_swap * len(probes.chunks(len(self.pairs), self.k_swap)))
        return len(self.win_slices) * per_chunk


def _passes(run, windows: np.ndarray, plan: _Plan, progress: bool) -> dict:
    """Sums over every window chunk of the baseline's, the skips' and the swaps'
    statistics (``n_pred``, ``n_tok``: predictions and tokens; ``fit``: the
    usefulness regression's moments)."""
    L = plan.L
    base_fn = probes.make_baseline(run)
    skip_fn = probes.make_skip(run) if plan.do_skip else None
    swap_fn = probes.make_swap(run) if plan.do_swap and plan.pairs else None
    sums: dict = {"n_pred": 0, "n_tok": 0, "fit": None, "probe_n": 0}
    bar = tqdm(total=plan.passes, desc=f"analyse {run.spec.family} L{L}", disable=not progress,
               unit="pass")
    for ws in plan.win_slices:
        tokens = jax.device_put(windows[ws], run.batch_sharding())
        out, z = base_fn(run.params, tokens)
        _accumulate_baseline(sums, jax.device_get(out), tokens.shape)
        if plan.do_useful:
            sums["fit"] = _accumulate_fit(sums["fit"], np.asarray(jax.device_get(z), np.float64))
        bar.update(1)
        if skip_fn is not None:
            for sl in probes.chunks(L, plan.k_skip):
                rows = _pad_rows(plan.skip_rows[sl], plan.k_skip)
                num, den, ratio, nll = jax.device_get(skip_fn(run.params, tokens, z, rows))
                n = sl.stop - sl.start
                _accumulate_rows(sums, "skip_num", sl, L, np.asarray(num)[:n])
                _accumulate_rows(sums, "skip_ratio", sl, L, np.asarray(ratio)[:n])
                _accumulate_rows(sums, "skip_nll", sl, L, np.asarray(nll)[:n])
                bar.update(1)
            _accumulate(sums, "skip_den", np.asarray(den, np.float64))
        if swap_fn is not None:
            for sl in probes.chunks(len(plan.pairs), plan.k_swap):
                nll = jax.device_get(swap_fn(run.params, tokens,
                                             _pad_rows(plan.swap_rows[sl], plan.k_swap)))
                _accumulate_rows(sums, "swap_nll", sl, len(plan.pairs),
                                 np.asarray(nll)[: sl.stop - sl.start])
                bar.update(1)
    bar.close()
    return sums


def _accumulate_baseline(sums: dict, out: dict, shape_bt: tuple[int, int]) -> None:
    """Add one window chunk's captured baseline forward to ``sums``."""
    n_windows, seq_len = shape_bt
    sums["n_pred"] += n_windows * (seq_len - 1)
    sums["n_tok"] += n_windows * seq_len
    _accumulate(sums, "nll", out["nll"])
    for key in ("lens_ce", "lens_kl", "lens_top", "angular"):
        _accumulate(sums, key, np.asarray(out[key], np.float64))
    for key, fn in zip(("stable_rank", "effective_rank"),
                       probes.spectra(np.asarray(out["svals"])), strict=True):
        _accumulate(sums, key, fn * n_windows)
    _accumulate(sums, "probe", jax.tree.map(lambda a: np.asarray(a, np.float64), out["probe"]))
    sums["probe_n"] += 1
    if "stream_cos" in out:
        _accumulate(sums, "stream_cos", np.asarray(out["stream_cos"], np.float64))
        _accumulate(sums, "stream_erank", np.asarray(out["stream_erank"], np.float64))


def _summarise(sums: dict, plan: _Plan, loss: float, causal_ratio: str,
               prune_threshold: float) -> dict:
    """The metrics that follow from the passes' sums alone."""
    L, want, n_pred, n_tok = plan.L, plan.want, sums["n_pred"], sums["n_tok"]
    result = {}
    if "angular_distance" in want:
        ang = M.upper(sums["angular"] / n_tok)
        result["angular_distance"] = {
            "matrix": _rows(ang), "adjacent": [float(ang[i, i + 1]) for i in range(L)]}
    if "logit_lens" in want:
        result["logit_lens"] = {
            "early_exit_ce": (sums["lens_ce"] / n_pred).tolist(),
            "kl_to_final": (sums["lens_kl"] / n_pred).tolist(),
            "top5_overlap": (sums["lens_top"] / n_pred).tolist(), "final_loss": loss}
    if "token_collapse" in want:
        result["token_collapse"] = {
            "stable_rank": (sums["stable_rank"] / plan.n_win).tolist(),
            "effective_rank": (sums["effective_rank"] / plan.n_win).tolist()}
    if plan.do_skip:
        pruned = sums["skip_nll"] / n_pred
        if "layer_pruning" in want:
            result["layer_pruning"] = {"baseline_loss": loss, "loss": pruned.tolist(),
                                       "delta": (pruned - loss).tolist()}
        if "causal_score" in want:
            if causal_ratio == "of_means":
                c = M.causal_matrix(sums["skip_num"], sums["skip_den"])
            else:
                c = M.upper(sums["skip_ratio"] / n_tok)
            global_score, per = M.global_causal_score(c)
            result["causal_score"] = {"matrix": _rows(c), "per_block": per,
                                      "global": global_score, "ratio": causal_ratio}
    if plan.do_swap:
        p = np.full((L, L), np.nan)
        for k, (i, j) in enumerate(plan.pairs):
            p[i, j] = abs(sums["swap_nll"][k] / n_pred - loss) / loss
        result["permutation_score"] = {
            "matrix": _rows(p), "baseline_loss": loss,
            "global_mean": float(np.nanmean(p)) if plan.pairs else 0.0}
    if "late_layer_interaction" in want:
        c = _matrix(result["causal_score"]["matrix"])
        p = _matrix(result["permutation_score"]["matrix"])
        skip = M.late_layer_fraction(c, M.SKIP_THRESHOLD)
        swap = M.late_layer_fraction(p, M.SWAP_THRESHOLD)
        result["late_layer_interaction"] = {"skip_fraction": skip["fraction"],
                                            "swap_fraction": swap["fraction"],
                                            "skip": skip, "swap": swap}
    return result


def _routing(sums: dict, plan: _Plan) -> dict:
    """The families' routing metrics from their probes: attnres's depth weights,
    the stream families' diversity and mixing."""
    L, want, result = plan.L, plan.want, {}
    probe = jax.tree.map(lambda a: a / sums["probe_n"], sums.get("probe", {}))
    if "depth_weights" in want and "depth_weights" in probe:
        w = probe["depth_weights"].reshape(2 * L, -1)
        result["depth_weights"] = {"weights": w.tolist(), **M.dead_segment(w)}
    if "stream_diversity" in want and ("mixing" in probe or "stream_cos" in sums):
        sd = {}
        if "stream_cos" in sums:
            sd["stream_cosine"] = (sums["stream_cos"] / sums["n_tok"]).tolist()
            sd["stream_effective_rank"] = (sums["stream_erank"] / sums["n_tok"]).tolist()
        if "mixing" in probe:
            mix = probe["mixing"].reshape(2 * L, *probe["mixing"].shape[-2:])
            ranks = M.stream_mixing_rank(mix)
            sd.update({"mixing": mix.tolist(), "composed_effective_rank": ranks,
                       "composed_effective_rank_final": ranks[-1],
                       "composed_effective_rank_mean": float(np.mean(ranks))})
        result["stream_diversity"] = sd
    return result


def _accumulate(sums: dict, key: str, value) -> None:
    if key not in sums:
        sums[key] = value
    else:
        sums[key] = jax.tree.map(lambda a, b: a + b, sums[key], value)


def _accumulate_rows(sums: dict, key: str, sl: slice, n: int, rows) -> None:
    rows = np.asarray(rows, np.float64)
    if key not in sums:
        sums[key] = np.zeros((n, *rows.shape[1:]))
    sums[key][sl] += rows


def _matrix(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in r] for r in rows], np.float64)


def _accumulate_fit(fit, z_lbtd: np.ndarray):
    """Normal equations of the affine fits ``z_{l+1} ~ [z_l, 1] W`` for every block."""
    x = z_lbtd.reshape(z_lbtd.shape[0], -1, z_lbtd.shape[-1])
    ones = np.ones((*x.shape[:2], 1))
    xa = np.concatenate([x[:-1], ones[:-1]], axis=-1)  # [L, N, D+1]
    xtx = np.einsum("lnd,lne->lde", xa, xa)
    xty = np.einsum("lnd,lne->lde", xa, x[1:])
    if fit is None:
        return [xtx, xty]
    return [fit[0] + xtx, fit[1] + xty]


def _usefulness(run, windows, win_slices, fit, loss, n_pred, chunk, progress) -> dict:
    L = run.depth
    w = np.stack([np.linalg.lstsq(fit[0][i], fit[1][i], rcond=None)[0] for i in range(L)])
    w_ldd, b_ld = w[:, :-1].astype(np.float32), w[:, -1].astype(np.float32)
    bw = Blockwise(run)

    def fn(params, tokens, pos_k, w_kdd, b_kd):
        return jax.vmap(lambda p, wd, bd: probes.nll_sum(bw.forward(params, tokens, p, wd, bd),
                                                         tokens))(pos_k, w_kdd, b_kd)

    sub_fn = probes.cached("usefulness", run, lambda: run.jit(fn, 1, 3))
    k = min(chunk, L)
    nll = np.zeros(L)
    bar = tqdm(total=len(win_slices) * len(probes.chunks(L, k)), desc="usefulness",
               disable=not progress, unit="pass")
    for ws in win_slices:
        tokens = jax.device_put(windows[ws], run.batch_sharding())
        for sl in probes.chunks(L, k):
            pos = _pad_rows(np.arange(L, dtype=np.int32)[sl, None], k)[:, 0]
            out = sub_fn(run.params, tokens, jnp.asarray(pos), jnp.asarray(w_ldd[pos]),
                         jnp.asarray(b_ld[pos]))
            nll[sl] += np.asarray(jax.device_get(out), np.float64)[: sl.stop - sl.start]
            bar.update(1)
    bar.close()
    ratio = (nll / n_pred) / loss
    significant = ratio > M.USEFUL_RATIO
    return {"loss_ratio": ratio.tolist(), "linear_loss": (nll / n_pred).tolist(),
            "significant": significant.tolist(), "count": int(significant.sum()),
            "score": float(significant.mean()), "threshold": M.USEFUL_RATIO,
            "baseline_loss": loss}


def _jacobians(run, windows, chunk: int, progress: bool) -> dict:
    L = run.depth
    bw = Blockwise(run)
    tokens = jax.device_put(windows, run.batch_sharding())
    states = probes.cached("entry_states", run, lambda: jax.jit(bw.entry_states))(
        run.params, tokens)
    z_width = int(jax.eval_shape(
        lambda p, s: bw.probes.boundary_state(bw.family_params(p, 0), p.get("residual", {}), s),
        run.params, jax.tree.map(lambda a: a[0], states)).shape[-1])
    rows_fn = probes.cached("jacobian_rows", run, lambda: jax.jit(bw.block_jacobian_rows))
    eye = np.eye(z_width, dtype=np.float32)
    devs = []
    for pos in tqdm(range(L), desc="block Jacobians", disable=not progress, unit="block"):
        state = jax.tree.map(lambda a, pos=pos: a[pos], states)
        rows = [np.asarray(jax.device_get(rows_fn(run.params, state, jnp.int32(pos), tokens,
                                                  _pad_rows(eye[sl], chunk))))[: sl.stop - sl.start]
                for sl in probes.chunks(z_width, chunk)]
        jac = np.concatenate(rows)
        devs.append(float(np.linalg.norm(jac - np.eye(z_width)) / np.sqrt(z_width)))
    return {"deviation": devs, "windows": int(windows.shape[0]), "width": z_width}
