"""The data pipeline with worker processes (``data.worker_count``): the same
batches as in-process, and the same after a resume from the iterator's state."""

from __future__ import annotations

import numpy as np
import pytest
from data_synthetic import make_config_like

from depthbench import data


@pytest.mark.slow  # starts grain worker processes (each imports jax: seconds)
def test_worker_processes_yield_the_same_batches_and_resume(prepared):
    config, p = prepared
    reference = data.train_iterator(config, p, process_index=0, process_count=1)
    expected = [next(reference) for _ in range(6)]
    mp_config = make_config_like(config, **{"data.worker_count": 2})
    it = data.train_iterator(mp_config, p, process_index=0, process_count=1)
    try:
        for want in expected[:3]:
            np.testing.assert_array_equal(next(it)["inputs"], want["inputs"])
        state = it.get_state()
    finally:
        it.close()
    resumed = data.train_iterator(mp_config, p, process_index=0, process_count=1)
    try:
        resumed.set_state(state)
        for want in expected[3:]:
            np.testing.assert_array_equal(next(resumed)["inputs"], want["inputs"])
    finally:
        resumed.close()
