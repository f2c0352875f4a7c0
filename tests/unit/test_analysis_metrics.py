"""Known answers of the host-side analysis maths (no model involved)."""

import jax.numpy as jnp
import numpy as np
import pytest

from depthbench.analysis import metrics as M
from depthbench.analysis import probes


def test_late_layer_fractions_on_a_hand_built_matrix():
    L = 8  # indices >= L/4 = 2: pairs among 2..7, 15 of them
    c = np.full((L, L), np.nan)
    for i in range(L):
        for j in range(i + 1, L):
            c[i, j] = 0.1
    c[0, 5] = c[1, 7] = 0.9  # early rows never count
    c[2, 3] = c[4, 6] = c[6, 7] = 0.5  # three late pairs above 0.45
    c[3, 4] = 0.45  # not strictly above
    got = M.late_layer_fraction(c, M.SKIP_THRESHOLD)
    assert got["pairs"] == 15 and got["above"] == 3
    assert got["fraction"] == pytest.approx(3 / 15)
    # L = 6: L/4 = 1.5, so indices 2..5 (6 pairs); swap threshold 0.15.
    p = M.upper(np.full((6, 6), 0.2))
    p[1, 2] = 0.0
    p[2, 3] = 0.1
    got = M.late_layer_fraction(p, M.SWAP_THRESHOLD)
    assert (got["pairs"], got["above"]) == (6, 5)


def test_causal_matrix_is_a_ratio_of_token_means():
    num = np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    den = np.array([1.0, 4.0, 0.0])  # last: no change at all -> 0, not nan
    c = M.causal_matrix(num, den)
    assert c[0, 1] == 0.5 and c[1, 2] == 0.0 and c[0, 2] == 0.0
    assert np.isnan(c[1, 0]) and np.isnan(c[1, 1])
    score, per = M.global_causal_score(c)
    assert per[:2] == [0.25, 0.0]
    assert score == pytest.approx(0.25 / (3 * np.sqrt(3)))


def test_ranks_of_known_spectra():
    assert M.stable_rank(np.array([2.0, 2.0, 2.0])) == pytest.approx(3.0)
    assert M.effective_rank(np.array([1.0, 1.0, 1.0, 1.0])) == pytest.approx(4.0)
    assert M.effective_rank(np.array([5.0, 0.0, 0.0])) == pytest.approx(1.0, abs=1e-9)
    assert M.stable_rank(np.zeros(3)) == 1.0 and M.effective_rank(np.zeros(3)) == 1.0
    # p = (0.8, 0.2): exp(H) = 0.8^-0.8 * 0.2^-0.2
    assert M.effective_rank(np.sqrt([0.8, 0.2])) == pytest.approx(0.8**-0.8 * 0.2**-0.2)


def test_identical_streams_have_rank_one():
    n, d = 4, 6
    x = np.random.default_rng(0).normal(size=(3, 2, 5, d))  # [L+1, B, T, d]
    z = jnp.asarray(np.tile(x, (1, 1, 1, n)))  # n identical streams, concatenated
    cos_sum, svals = probes._streams(z, d)
    np.testing.assert_allclose(np.asarray(cos_sum) / 10, 1.0, rtol=1e-5)
    np.testing.assert_allclose(M.effective_rank(np.asarray(svals)), 1.0, atol=1e-4)
    # Orthogonal streams: rank n, cosine 0.
    eye = np.zeros((1, 1, 1, n * d))
    for s in range(n):
        eye[..., s * d + s] = 1.0
    cos_sum, svals = probes._streams(jnp.asarray(eye), d)
    assert abs(float(cos_sum[0])) < 1e-6
    assert M.effective_rank(np.asarray(svals))[0, 0, 0] == pytest.approx(n)


def test_composed_mixing_rank():
    n = 4
    assert M.stream_mixing_rank(np.stack([np.eye(n)] * 3)) == pytest.approx([n] * 3)
    avg = np.full((n, n), 1 / n)  # every stream becomes the mean: rank 1 from then on
    ranks = M.stream_mixing_rank(np.stack([np.eye(n), avg, np.eye(n)]))
    assert ranks[0] == pytest.approx(n) and ranks[1:] == pytest.approx([1.0, 1.0], abs=1e-4)
    perm = np.eye(n)[[1, 2, 3, 0]]
    np.testing.assert_allclose(M.composed_mixing(np.stack([perm, perm]))[-1],
                               (perm.T @ perm.T))


def test_dead_segment_counts_leading_blocks():
    # 4 blocks = 8 sublayers; embedding weight of each sublayer's mix:
    emb = [1.0, 0.9, 0.7, 0.6, 0.8, 0.4, 0.9, 0.9]
    w = np.zeros((8, 9))
    w[:, 0] = emb
    w[:, 1] = 1 - np.array(emb)
    got = M.dead_segment(w)
    assert got["dead_segment"] == 2 and got["dead_segment_sublayers"] == 5


def test_effective_depth_counts_blocks_that_matter():
    got = M.effective_depth(np.array([2.2, 2.0, 2.03, 2.019]), 2.0)
    assert got["value"] == 2 and got["needed"] == [True, False, True, False]
