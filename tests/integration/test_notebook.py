"""notebooks/residual_streams.ipynb runs top to bottom (small settings, runs given)."""

import pytest
from analysis_tiny import tiny_config, write_run
from paths import REPO

NOTEBOOK = REPO / "notebooks" / "residual_streams.ipynb"


@pytest.mark.slow
def test_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    runs = []
    for family in ("hc", "attnres_full"):
        run_dir = tmp_path / family
        write_run(run_dir, tiny_config(family, 2), val_tokens=2000)
        runs.append(str(run_dir))
    monkeypatch.setenv("DEPTHBENCH_NB_RUNS", ",".join(runs))
    monkeypatch.setenv("DEPTHBENCH_NB_WINDOWS", "2")
    monkeypatch.setenv("DEPTHBENCH_NB_SEQ_LEN", "16")
    monkeypatch.setenv("DEPTHBENCH_NB_WORKDIR", str(tmp_path / "nb"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "dead segment:" in text and "composed mixing rank" in text
    assert "KL to final by depth" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6  # angular x2, depth weights, mixing, lens, causal x2
    assert not (tmp_path / "nb" / "pre_ln").exists()  # given runs: nothing trained
