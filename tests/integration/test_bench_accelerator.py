"""``python -m bench.accelerator --dry`` (integration: subprocesses).

The dry run measures every part at tiny shapes on this CPU and writes the
report into a temporary folder (never into the checkout); each part's
section must hold its rows with real numbers (every family, every kernel
and pass, losses that fell).  A part made to hang (``--hang``) is killed at
its deadline and reported as timed out, and the parts after it still run.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

ROUTING = ("hc", "mhc", "attnres_block", "attnres_full", "moda")
KERNEL_FAMILIES = ("hc", "mhc", "attnres_block", "attnres_full", "moda")


def run(tmp_path: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.accelerator", "--dry", "--out",
                           str(tmp_path), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def sections(report: str) -> dict[str, str]:
    """``## part: title`` -> the section's text."""
    parts = re.split(r"^## (\w+): .*$", report, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def tables(section: str) -> list[list[dict[str, str]]]:
    """Every markdown table of a section, as rows of {column: cell}."""
    out, lines = [], section.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            head = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(dict(zip(head, (c.strip() for c in body.strip("|").split("|")),
                                     strict=True)))
            out.append(rows)
    return out


def number(cell: str) -> float:
    """A cell's number (``1,234``, ``1.2x``, ``45.0%``, ``1e-05``)."""
    return float(re.match(r"-?[\d,.]+(e-?\d+)?", cell).group(0).replace(",", ""))


def dry_report(tmp_path: Path) -> dict[str, str]:
    """The dry run's report, by section; the run writes nothing into the checkout."""
    results = REPO / "bench" / "results"
    before = sorted(results.iterdir())
    proc = run(tmp_path)
    assert sorted(results.iterdir()) == before, "the dry run wrote into the checkout"
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("accelerator-cpu-dry-*.md"))
    assert len(files) == 1, list(tmp_path.iterdir())
    assert files[0].read_text().strip() in proc.stdout  # printed as written
    return sections(files[0].read_text())


# What each part of the dry run's report must hold, one function per part.  One
# test runs the dry run (minutes) and every check: as separate tests sharing a
# module fixture, pytest-xdist gave both workers some of them and the second
# waited out the first's dry run (51 s of the suite's 2-core time; its
# ``--dist loadgroup`` does not group under pytest 9).


def check_every_part_has_a_section_that_finished(dry):
    assert list(dry) == ["versions", "mfu", "families", "kernels", "precision", "memory",
                         "inference"]
    for name, text in dry.items():
        assert re.search(r"\*\*done in \d+ s\*\*", text), (name, text[-500:])
        assert tables(text), name


def check_versions_and_device(dry):
    packages, device = tables(dry["versions"])
    assert {r["package"] for r in packages} >= {"jax", "jaxlib", "flax", "optax"}
    assert device[0]["device"] == "cpu" and device[0]["peak bf16 TFLOP/s"] == "-"
    assert "jax 0." in dry["versions"]  # the machine header


def check_mfu_row_has_measured_numbers(dry):
    (row,) = tables(dry["mfu"])[0]
    assert number(row["step (ms)"]) > 0 and number(row["tokens/s"]) > 0
    assert number(row["model TFLOP/s"]) > 0 and number(row["memory (GiB)"]) > 0
    assert row["MFU"].startswith("-")  # a CPU has no published peak: no MFU is made up
    assert math.isfinite(number(row["loss"]))


def check_families_xla_and_pallas_against_pre_ln(dry):
    rows = tables(dry["families"])[0]
    got = {(r["family"], r["impl"]) for r in rows}
    want = {("pre_ln", "xla"), *((f, "xla") for f in ROUTING + KERNEL_FAMILIES),
            *((f, "pallas") for f in KERNEL_FAMILIES)}
    assert got == want
    for r in rows[1:]:
        assert number(r["step (ms)"]) > 0 and number(r["time / pre_ln"]) > 0
        assert number(r["memory / pre_ln"]) > 0.5


def check_kernels_forward_and_backward(dry):
    rows = tables(dry["kernels"])[0]
    assert {(r["kernel"].split()[0], r["pass"]) for r in rows} == {
        (k, p) for k in ("depth_attention", "stream_post", "hc_pre", "mhc_pre", "moda_attention")
        for p in ("fwd", "fwd+bwd")}
    for r in rows:
        assert number(r["pallas_ms"]) > 0 and number(r["xla_ms"]) > 0
        assert number(r["MB moved"]) > 0 and number(r["pallas_gbs"]) > 0
    assert "interpreted" in dry["kernels"]


def check_precision_every_routing_family_trained_in_both_dtypes(dry):
    rows = tables(dry["precision"])[0]
    assert [r["family"] for r in rows] == ["pre_ln", *ROUTING]
    for r in rows:
        assert number(r["fp32 last"]) < number(r["fp32 first"]), r  # the batch is learned
        assert abs(number(r["bf16 last"]) - number(r["fp32 last"])) < 0.05, r
        assert number(r["max abs(bf16 - fp32)"]) > 0, r  # bf16 really ran in bf16


def check_memory_of_every_family(dry):
    rows = tables(dry["memory"])[0]
    assert [r["family"] for r in rows] == ["pre_ln", "attnres_full", "attnres_block", "moda",
                                          "mhc", "hc"]
    assert rows[0]["memory / pre_ln"] == "1.00x"
    assert all(number(r["memory (GiB)"]) > 0 for r in rows)


def check_inference_against_depth(dry):
    """Decode latency and cache per token at the shallowest and deepest micro shapes:
    the cache grows with depth at a fixed parameter count (L x d: 2.63x from L2 to L10)."""
    rows = tables(dry["inference"])[0]
    assert [(r["depth"], r["family"]) for r in rows] == [
        ("2", "pre_ln"), ("2", "moda"), ("10", "pre_ln"), ("10", "moda")]
    for r in rows:
        assert number(r["ms/token"]) > 0 and number(r["TTFT ms"]) > 0
        assert number(r["decode tok/s"]) > 0 and number(r["peak MiB"]) > 0
    assert rows[2]["cache vs shallowest"] == "2.63x"
    assert rows[1]["ms/token vs shallowest"] == "1.00x"


CHECKS = (check_every_part_has_a_section_that_finished, check_versions_and_device,
          check_mfu_row_has_measured_numbers, check_families_xla_and_pallas_against_pre_ln,
          check_kernels_forward_and_backward,
          check_precision_every_routing_family_trained_in_both_dtypes,
          check_memory_of_every_family, check_inference_against_depth)


@pytest.mark.slow  # the dry run: minutes on a 2-core CPU
def test_dry_run_report(tmp_path):
    """Every check runs, and the test names each one that failed."""
    report = dry_report(tmp_path)
    failed = []
    for check in CHECKS:
        try:
            check(report)
        except AssertionError as e:
            failed.append(f"{check.__name__}: {e}"[:1500])
    assert not failed, "\n".join(failed)


def test_a_hanging_part_times_out_and_the_next_still_runs(tmp_path):
    proc = run(tmp_path, "--only", "versions,kernels,mfu", "--hang", "kernels",
               "--timeout", "kernels=3")
    assert proc.returncode == 1, proc.stderr[-2000:]  # not every part finished
    (path,) = tmp_path.glob("accelerator-*.md")
    parts = sections(path.read_text())
    assert list(parts) == ["versions", "kernels", "mfu"]
    assert re.search(r"\*\*TIMED OUT after \d+ s \(deadline 3 s\)\*\*", parts["kernels"])
    assert not tables(parts["kernels"])
    for name in ("versions", "mfu"):
        assert re.search(r"\*\*done in \d+ s\*\*", parts[name]), parts[name][-500:]
    assert number(tables(parts["mfu"])[0][0]["tokens/s"]) > 0


@pytest.mark.parametrize("args, field", [
    (["--only", "mfu,warp"], "--only"),
    (["--timeout", "mfu=soon"], "--timeout"),
    (["--timeout", "nothing=3"], "--timeout"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, field):
    proc = run(tmp_path, *args, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "error" in lines[0], proc.stderr
    assert not list(tmp_path.iterdir())
