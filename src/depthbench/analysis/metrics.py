"""Host-side metric maths (numpy): the parts of docs/spec/analysis.md that act
on already reduced numbers, so they can be tested on hand-built inputs.

Matrices are ``list[list[float | None]]``-ready numpy arrays with ``nan``
where a pair is undefined; per-depth series are indexed by depth.
"""

from __future__ import annotations

import math

import numpy as np

SKIP_THRESHOLD = 0.45  # late-layer interaction: causal score C above this
SWAP_THRESHOLD = 0.15  # ... and permutation score P above this
USEFUL_RATIO = 1.1  # usefulness: an affine stand-in raises loss by more than 10%
DEAD_WEIGHT = 0.5  # dead segment: a mix puts more than half its weight on x0
PRUNE_THRESHOLD = 0.01  # effective depth: removing the block raises loss by > 1%


def stable_rank(s: np.ndarray) -> np.ndarray:
    """``sum s^2 / max s^2`` over the last axis (1 where all ``s`` vanish)."""
    s2 = np.square(np.asarray(s, np.float64))
    total, top = s2.sum(-1), s2.max(-1)
    return np.where(total < 1e-12, 1.0, total / np.maximum(top, 1e-300))


def effective_rank(s: np.ndarray) -> np.ndarray:
    """``exp(H(p))``, ``p = s^2 / sum s^2`` (Roy & Vetterli), over the last axis
    (1 where all ``s`` vanish; ``p`` clamped at 1e-12 as the original does)."""
    s2 = np.square(np.asarray(s, np.float64))
    total = s2.sum(-1, keepdims=True)
    p = np.clip(s2 / np.maximum(total, 1e-300), 1e-12, None)
    h = -(p * np.log(p)).sum(-1)
    return np.where(total[..., 0] < 1e-12, 1.0, np.exp(h))


def upper(matrix: np.ndarray, offset: int = 1) -> np.ndarray:
    """``matrix`` with ``nan`` on and below the ``offset - 1`` diagonal."""
    m = np.array(matrix, np.float64)
    m[np.tril_indices(m.shape[0], offset - 1, m.shape[1])] = np.nan
    return m


def causal_matrix(num_kl: np.ndarray, den_l: np.ndarray) -> np.ndarray:
    """``C[s, l] = num[s, l] / den[l]`` (sums over the same tokens, so a ratio of
    token means), 0 where ``den < 1e-8`` per token, ``nan`` unless ``l > s``."""
    num, den = np.asarray(num_kl, np.float64), np.asarray(den_l, np.float64)
    c = np.where(den[None, :] > 1e-8, num / np.where(den > 0, den, 1.0)[None, :], 0.0)
    return upper(c)


def global_causal_score(c: np.ndarray) -> tuple[float, list[float]]:
    """The original's summary: per skipped block the mean of its future
    scores, summed and scaled by ``L^{-3/2}``."""
    L = c.shape[0]
    per = [float(np.nanmean(c[s, s + 1:])) if s + 1 < L else 0.0 for s in range(L)]
    return float(sum(per[:-1]) / (L * math.sqrt(L))) if L else 0.0, per


def late_layer_fraction(matrix: np.ndarray, threshold: float) -> dict:
    """Fraction of pairs ``(i, j)``, ``i < j``, both indices ``>= L/4``, whose
    entry exceeds ``threshold`` (``nan`` entries are not pairs)."""
    L = matrix.shape[0]
    i, j = np.triu_indices(L, 1)
    keep = (i >= L / 4) & (j >= L / 4)
    values = matrix[i[keep], j[keep]]
    values = values[np.isfinite(values)]
    count = int((values > threshold).sum())
    return {"fraction": float(count / values.size) if values.size else 0.0,
            "pairs": int(values.size), "above": count, "threshold": threshold,
            "min_index": L / 4}


def dead_segment(weights_jm: np.ndarray, threshold: float = DEAD_WEIGHT) -> dict:
    """Leading sublayers (and blocks: both sublayers) whose depth mix puts
    more than ``threshold`` of its weight on the embedding (source 0)."""
    emb = np.asarray(weights_jm, np.float64)[:, 0]
    dead = emb > threshold
    sub = int(np.argmin(dead)) if not dead.all() else dead.size
    blocks_dead = dead.reshape(-1, 2).all(axis=1)
    blocks = int(np.argmin(blocks_dead)) if not blocks_dead.all() else blocks_dead.size
    return {"dead_segment": blocks, "dead_segment_sublayers": sub,
            "embedding_weight": emb.tolist(), "threshold": threshold}


def composed_mixing(mixing_jnn: np.ndarray) -> np.ndarray:
    """Products ``Pi_j = M_j^T ... M_0^T`` of the residual mixing matrices
    (``H[t] <- sum_s M[s, t] H[s]``: the streams after sublayer ``j`` are
    ``Pi_j`` applied to the embedding's copies), one per sublayer."""
    m = np.asarray(mixing_jnn, np.float64)
    out, prod = [], np.eye(m.shape[-1])
    for mj in m:
        prod = mj.T @ prod
        out.append(prod.copy())
    return np.stack(out)


def stream_mixing_rank(mixing_jnn: np.ndarray) -> list[float]:
    """Effective rank of each composed mixing product (n: streams stay distinct,
    1: they collapse onto one combination)."""
    prods = composed_mixing(mixing_jnn)
    return effective_rank(np.linalg.svd(prods, compute_uv=False)).tolist()


def effective_depth(pruned_loss_l: np.ndarray, loss: float,
                    threshold: float = PRUNE_THRESHOLD) -> dict:
    """Blocks the model cannot do without: the count of blocks whose removal
    alone raises the held-out loss by more than ``threshold`` (relative).
    See docs/spec/analysis.md ("Effective depth") for why."""
    rel = (np.asarray(pruned_loss_l, np.float64) - loss) / loss
    needed = rel > threshold
    return {"value": int(needed.sum()), "fraction": float(needed.mean()) if needed.size else 0.0,
            "needed": needed.tolist(), "relative_increase": rel.tolist(),
            "threshold": threshold,
            "definition": "blocks whose removal alone raises held-out loss by more than "
                          f"{threshold:.0%} (relative)"}
