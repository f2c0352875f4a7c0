"""launch/*.sh with fake gcloud / sbatch / srun / scontrol on PATH that record
their arguments; the recorded commands are checked, and the scripts pass
bash -n and shellcheck."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO

LAUNCH = REPO / "launch"
SCRIPTS = ["tpu_sweep.sh", "gpu_sweep.sh", "local_sweep.sh", "local_multiprocess.sh"]
SPEC = "experiments/quickstart.py"
PRE_LN = ["pre_ln-L2-lr3e-03", "pre_ln-L4-lr3e-03", "pre_ln-L10-lr3e-03"]

# A fake cloud/cluster tool: records argv (and a few env vars) as one JSON line, and
# for gcloud keeps a slice state in $FAKE_DIR/state (absent = no slice).
FAKE = r'''#!{python}
import json, os, sys
from pathlib import Path
fake = Path(os.environ["FAKE_DIR"])
tool = Path(sys.argv[0]).name
args = sys.argv[1:]
env = {{k: os.environ.get(k) for k in ("DEPTHBENCH_COORD_PORT", "CUDA_VISIBLE_DEVICES",
                                       "JAX_PLATFORMS", "DEPTHBENCH_MALLOC")}}
with open(fake / "calls.jsonl", "a") as f:
    f.write(json.dumps({{"tool": tool, "args": args, "env": env}}) + "\n")
state = fake / "state"
if tool == "scontrol":
    print("node-a\nnode-b")
elif tool == "depthbench":
    sys.exit(1 if "--shard" in args and args[args.index("--shard") + 1] == "1/2"
             and (fake / "fail_shard_1").exists() else 0)
elif tool == "gcloud" and args[:3] == ["compute", "tpus", "tpu-vm"]:
    verb = args[3]
    if verb == "describe":
        if not state.exists():
            sys.exit(1)
        print(state.read_text())
    elif verb == "create":
        state.write_text("READY")
    elif verb == "delete":
        state.unlink()
    elif verb == "ssh":
        command = args[args.index("--command") + 1]
        for line in (fake / "preempt").read_text().split() if (fake / "preempt").exists() else []:
            marker = fake / ("preempted-" + line)
            if line in command and not marker.exists():
                marker.touch()
                state.write_text("PREEMPTED")
                sys.exit(255)
        if (fake / "fail").exists() and (fake / "fail").read_text().strip() in command:
            sys.exit(1)
elif tool == "gcloud" and args[:2] == ["storage", "ls"]:
    if (fake / "finished").exists():
        print((fake / "finished").read_text())
    else:
        sys.exit(1)
'''


@pytest.fixture()
def fakes(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("gcloud", "sbatch", "srun", "scontrol", "depthbench"):
        path = bin_dir / tool
        path.write_text(FAKE.format(python=sys.executable))
        path.chmod(0o755)
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for var in ("TPU_NAME", "TPU_ZONE", "ZONE", "TPU_PROJECT", "TPU_ACCELERATOR", "SLURM_JOB_ID",
                "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NUM_NODES", "DEPTHBENCH"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def calls(fake_dir: Path, tool: str | None = None) -> list[dict]:
    path = fake_dir / "calls.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if tool is None or r["tool"] == tool]


REAL_DEPTHBENCH = f"{sys.executable} -m depthbench"


def sh(script: str, *args: str, env: dict | None = None, cwd: Path = REPO):
    return subprocess.run(["bash", str(LAUNCH / script), *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=120)


# ------------------------------------------------------------ static checks


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_are_executable(script):
    assert os.access(LAUNCH / script, os.X_OK)
    result = subprocess.run(["bash", "-n", str(LAUNCH / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    help_text = subprocess.run(["bash", str(LAUNCH / script), "--help"], capture_output=True,
                               text=True)
    assert help_text.returncode == 0 and "usage: launch/" in help_text.stdout


def _options_with_values(script: str) -> list[str]:
    """Every option the script's parser reads a value for (``--x) need "$@"; ...``)."""
    return re.findall(r'^\s+(--[\w-]+)\) need "\$@";', (LAUNCH / script).read_text(), re.M)


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_option_without_its_value_is_bad_usage(script, fakes):
    """Each value-taking option given last, or with an empty value: exit 2 (the
    scripts' documented status for bad usage, not bash's 1), the usage, then one
    line naming the option; nothing is started."""
    options = _options_with_values(script)
    assert len(options) >= 4, options
    lead = ["2"] if script == "local_multiprocess.sh" else []
    for option in options:
        for args in ([*lead, option], [*lead, option, ""]):
            r = sh(script, *args)
            assert r.returncode == 2, (args, r.stderr[-2000:])
            lines = r.stderr.splitlines()
            assert lines[0].startswith(f"usage: launch/{script} "), (args, r.stderr)
            assert lines[-1] == f"{script}: error: {option} needs a value", (args, r.stderr)
    assert calls(fakes) == []


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    result = subprocess.run(["shellcheck", *(str(LAUNCH / s) for s in SCRIPTS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# --------------------------------------------------------------------- TPU

TPU_ARGS = ["--config", SPEC, "--workdir", "gs://bkt/qs", "--tpu", "tpu1", "--zone", "zone1",
            "--project", "proj1", "--run", "pre_ln-*"]
WHERE = ["--zone", "zone1", "--project", "proj1"]
OVERRIDE = "--config.data.paths=gs://bkt/tok/*.npy"


def test_tpu_dry_run_prints_every_command_and_runs_none(fakes):
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--accelerator", "v5p-64", "--create", "--spot",
           "--delete", "--stage-data", "gs://bkt/tok", "--dry-run", "--", OVERRIDE,
           env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 0, r.stderr
    assert calls(fakes) == []  # nothing was run, only printed
    lines = [shlex.split(line[2:]) for line in r.stdout.splitlines() if line.startswith("+ ")]
    tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
    assert lines[0] == tpu + ["create", "tpu1", *WHERE, "--accelerator-type", "v5p-64",
                              "--version", "tpu-ubuntu2204-base", "--spot"]
    assert lines[1][0] == "tar" and lines[2][:5] == tpu + ["scp"]
    install = lines[3]
    assert install[:6] == tpu + ["ssh", "tpu1"] and "--worker=all" in install
    assert "pip install -q -e ." in install[-1] and "jax[tpu]" in install[-1]
    assert "gcsfuse" in install[-1]
    mount = lines.pop(4)  # the bucket, mounted at the same path on every worker
    assert mount[:6] == tpu + ["ssh", "tpu1"] and "--worker=all" in mount
    assert mount[-1] == ("mkdir -p /tmp/depthbench-gcs/bkt && (mountpoint -q "
                         "/tmp/depthbench-gcs/bkt || gcsfuse --implicit-dirs bkt "
                         "/tmp/depthbench-gcs/bkt)")
    stage = lines[4]
    assert stage[:6] == tpu + ["ssh", "tpu1"] and "--worker=all" in stage
    assert stage[-1] == ("mkdir -p /tmp/depthbench-data && gcloud storage rsync --recursive "
                         "gs://bkt/tok /tmp/depthbench-data")
    lines.pop(4)
    assert lines[4] == ["gcloud", "storage", "ls", "gs://bkt/qs/*/result.json"]
    runs = lines[5:8]
    for line, name in zip(runs, PRE_LN, strict=True):
        assert line[:6] == tpu + ["ssh", "tpu1"] and "--worker=all" in line
        assert shlex.split(line[-1]) == [
            "cd", "depthbench", "&&", ".venv/bin/depthbench", "sweep", "--config", SPEC,
            "--workdir", "/tmp/depthbench-gcs/bkt/qs", "--run", name, "--no-lock",
            "--no-progress", OVERRIDE]
    assert lines[8][-1] == ("cd depthbench && .venv/bin/depthbench report "
                            "/tmp/depthbench-gcs/bkt/qs")
    assert "--worker=0" in lines[8]
    assert lines[9] == tpu + ["delete", "tpu1", *WHERE, "--quiet"]
    assert len(lines) == 10


def test_tpu_remote_command_survives_the_remote_shell(fakes, tmp_path):
    """The --command string, run by bash on a worker, gives depthbench the exact argv."""
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--dry-run", "--", OVERRIDE, "--config.name=it's a run",
           env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 0, r.stderr
    # lines: mount the bucket, list finished runs, then the first run
    command = shlex.split(r.stdout.splitlines()[2][2:])[-1]
    home = tmp_path / "home"
    fake_bin = home / "depthbench" / ".venv" / "bin"
    fake_bin.mkdir(parents=True)
    (fake_bin / "depthbench").write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake_bin / "depthbench").chmod(0o755)
    out = subprocess.run(["bash", "-c", command], cwd=home, capture_output=True, text=True)
    assert json.loads(out.stdout) == [
        "sweep", "--config", SPEC, "--workdir", "/tmp/depthbench-gcs/bkt/qs", "--run", PRE_LN[0],
        "--no-lock", "--no-progress", OVERRIDE, "--config.name=it's a run"]


def test_tpu_sweep_skips_finished_and_resumes_after_preemption(fakes):
    (fakes / "finished").write_text(f"gs://bkt/qs/{PRE_LN[0]}/result.json\n")
    (fakes / "preempt").write_text(PRE_LN[1])
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--accelerator", "v4-32", "--create", "--", OVERRIDE,
           env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 0, r.stderr
    verbs = [c["args"][3] if c["args"][0] == "compute" else "storage-ls"
             for c in calls(fakes, "gcloud")]
    # create (no slice yet), install, mount, list finished, run 2 (preempted), recover:
    # delete, create, install, mount; run 2 again, run 3, report.
    assert verbs == ["describe", "create", "scp", "ssh", "ssh", "storage-ls", "ssh", "describe",
                     "delete", "create", "scp", "ssh", "ssh", "ssh", "ssh", "ssh"]
    ssh = [c["args"][-1] for c in calls(fakes, "gcloud") if c["args"][3:4] == ["ssh"]]
    ran = [name for cmd in ssh for name in PRE_LN if f"--run {name} " in cmd]
    assert ran == [PRE_LN[1], PRE_LN[1], PRE_LN[2]]  # the finished run is never started
    assert "3/3 runs finished" in r.stderr and "finished, skipped" in r.stderr


def test_tpu_sweep_without_create_stops_on_a_lost_slice(fakes):
    (fakes / "state").write_text("READY")
    (fakes / "preempt").write_text(PRE_LN[0])
    r = sh("tpu_sweep.sh", *TPU_ARGS, env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 1
    assert "slice tpu1 is 'PREEMPTED'; re-run with --create" in r.stderr
    # A failing run on a READY slice is recorded and the sweep goes on.
    (fakes / "state").write_text("READY")
    (fakes / "preempt").unlink()
    (fakes / "fail").write_text(PRE_LN[1])
    (fakes / "calls.jsonl").unlink()
    r = sh("tpu_sweep.sh", *TPU_ARGS, env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 1 and f"failed: {PRE_LN[1]}" in r.stderr
    ssh = [c["args"][-1] for c in calls(fakes, "gcloud") if c["args"][3:4] == ["ssh"]]
    assert sum(f"--run {PRE_LN[2]} " in cmd for cmd in ssh) == 1


def test_tpu_sweep_bad_usage_is_exit_2(fakes):
    r = sh("tpu_sweep.sh", "--config", SPEC, "--workdir", "gs://b/x", "--zone", "z")
    assert r.returncode == 2 and "--tpu NAME (or TPU_NAME) is required" in r.stderr
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--create")
    assert r.returncode == 2 and "--create needs --accelerator" in r.stderr
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--bogus")
    assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr
    assert calls(fakes) == []


def test_tpu_slice_settings_from_the_environment(fakes):
    env = {"TPU_NAME": "envtpu", "TPU_ZONE": "envzone", "TPU_PROJECT": "envproj",
           "DEPTHBENCH": REAL_DEPTHBENCH}
    r = sh("tpu_sweep.sh", "--config", SPEC, "--workdir", "gs://b/x", "--run", PRE_LN[0],
           "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    line = shlex.split(r.stdout.splitlines()[0][2:])
    assert line[4:9] == ["ssh", "envtpu", "--zone", "envzone", "--project"]


# ------------------------------------------------------------------- SLURM


def test_gpu_sweep_submits_itself_with_sbatch(fakes, tmp_path):
    workdir = tmp_path / "runs"
    r = sh("gpu_sweep.sh", "--config", SPEC, "--workdir", str(workdir), "--nodes", "4",
           "--gpus-per-node", "8", "--partition", "gpu", "--account", "acct",
           "--shard", "1/2", "--", OVERRIDE)
    assert r.returncode == 0, r.stderr
    (submit,) = calls(fakes, "sbatch")
    args = submit["args"]
    script = args.index(str(LAUNCH / "gpu_sweep.sh"))
    opts = args[:script]
    for flag, value in (("--nodes", "4"), ("--ntasks-per-node", "1"), ("--gpus-per-node", "8"),
                        ("--partition", "gpu"), ("--account", "acct")):
        assert opts[opts.index(flag) + 1] == value
    assert "--requeue" in opts
    assert args[script + 1:] == ["--in-job", "--config", str(REPO / SPEC), "--workdir",
                                 str(workdir), "--port", "29500", "--shard", "1/2", "--",
                                 OVERRIDE]
    assert (workdir / "logs").is_dir()


def test_gpu_sweep_in_job_runs_one_srun_step_per_unfinished_run(fakes, tmp_path):
    workdir = tmp_path / "runs"
    (workdir / PRE_LN[1]).mkdir(parents=True)
    (workdir / PRE_LN[1] / "result.json").write_text("{}")
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "DEPTHBENCH": REAL_DEPTHBENCH}
    r = sh("gpu_sweep.sh", "--in-job", "--config", str(REPO / SPEC), "--workdir", str(workdir),
           "--run", "pre_ln-*", "--port", "31000", "--", OVERRIDE, env=env)
    assert r.returncode == 0, r.stderr
    steps = calls(fakes, "srun")
    assert len(steps) == 2  # the finished run is skipped
    for step, name in zip(steps, [PRE_LN[0], PRE_LN[2]], strict=True):
        args = step["args"]
        assert args[:6] == ["--nodes", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
                            str(LAUNCH / "gpu_sweep.sh")]
        rest = args[6:]
        assert rest[:2] == ["--task", "--"]
        sweep = rest[rest.index("sweep"):]
        assert sweep == ["sweep", "--config", str(REPO / SPEC), "--workdir", str(workdir),
                         "--run", name, "--no-lock", "--no-progress", OVERRIDE]
    # A fresh coordinator port per run (31000 + run index in the selection).
    assert [s["env"]["DEPTHBENCH_COORD_PORT"] for s in steps] == ["31000", "31002"]


def test_gpu_task_exports_coordinator_and_process_ids(fakes):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
           "SLURM_STEP_NODELIST": "node-[a-b]", "DEPTHBENCH_COORD_PORT": "31005"}
    r = sh("gpu_sweep.sh", "--task", "--", "env", env=env)
    assert r.returncode == 0, r.stderr
    seen = dict(line.split("=", 1) for line in r.stdout.splitlines() if line.startswith("JAX_"))
    assert seen["JAX_COORDINATOR_ADDRESS"] == "node-a:31005"
    assert (seen["JAX_NUM_PROCESSES"], seen["JAX_PROCESS_ID"]) == ("2", "1")
    assert calls(fakes, "scontrol")[0]["args"] == ["show", "hostnames", "node-[a-b]"]


# ------------------------------------------------------------------- local


def test_local_sweep_starts_one_process_per_shard(fakes, tmp_path):
    workdir = tmp_path / "runs"
    env = {"DEPTHBENCH": str(fakes / "bin" / "depthbench")}
    r = sh("local_sweep.sh", "--config", SPEC, "--workdir", str(workdir), "--gpus", "3,5",
           "--interval", "1", "--", OVERRIDE, env=env)
    assert r.returncode == 0, r.stderr
    procs = sorted(calls(fakes, "depthbench"), key=lambda c: c["args"][6])
    assert [c["args"] for c in procs] == [
        ["sweep", "--config", SPEC, "--workdir", str(workdir), "--shard", f"{i}/2",
         "--no-progress", OVERRIDE] for i in range(2)]
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in procs] == ["3", "5"]
    assert (workdir / "logs" / "shard-0-of-2.log").exists()
    # CPU processes; one shard fails: exit 1 naming its log.
    (fakes / "fail_shard_1").touch()
    (fakes / "calls.jsonl").unlink()
    r = sh("local_sweep.sh", "--config", SPEC, "--workdir", str(workdir), "--procs", "2",
           "--interval", "1", env=env)
    assert r.returncode == 1 and "shard 1/2 failed; see" in r.stderr
    assert {(c["env"]["JAX_PLATFORMS"], c["env"]["DEPTHBENCH_MALLOC"])
            for c in calls(fakes, "depthbench")} == {("cpu", "mimalloc")}


def test_local_sweep_dry_run(fakes, tmp_path):
    r = sh("local_sweep.sh", "--config", SPEC, "--workdir", "runs/x", "--procs", "3",
           "--cpus-per-proc", "2", "--report", "--dry-run", env={"DEPTHBENCH": "depthbench"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == ("+ env JAX_PLATFORMS=cpu DEPTHBENCH_MALLOC=mimalloc taskset -c 0-1 "
                        "depthbench sweep --config "
                        f"{SPEC} --workdir runs/x --shard 0/3 --no-progress > "
                        "runs/x/logs/shard-0-of-3.log 2>&1 &")
    assert "taskset -c 4-5" in lines[3] and lines[4] == "+ depthbench report runs/x"
    assert calls(fakes) == [] and not (tmp_path / "runs").exists()


# ------------------------------------------------------- data step (tokenize)

TOKENIZE = ["--tokenize", "gs://bkt/raw", "--tokenizer", "gs://bkt/neox/tokenizer.json",
            "--stage-data", "gs://bkt/tok"]
TOKENIZE_COMMAND = (
    "if gcloud storage ls gs://bkt/tok/manifest.json >/dev/null 2>&1; then echo "
    "'gs://bkt/tok already tokenised'; else mkdir -p /tmp/depthbench-raw && gcloud storage "
    "rsync --recursive gs://bkt/raw /tmp/depthbench-raw && mkdir -p "
    "/tmp/depthbench-raw-tokenizer && gcloud storage cp gs://bkt/neox/tokenizer.json "
    "/tmp/depthbench-raw-tokenizer/tokenizer.json && cd depthbench && "
    ".venv/bin/depthbench data tokenize --input '/tmp/depthbench-raw/**/*.parquet' "
    "--text-field text --tokenizer /tmp/depthbench-raw-tokenizer/tokenizer.json --out "
    "/tmp/depthbench-tokens --workers $(nproc) && gcloud storage rsync --recursive "
    "--exclude='manifest\\.json$' /tmp/depthbench-tokens gs://bkt/tok && gcloud storage cp "
    "/tmp/depthbench-tokens/manifest.json gs://bkt/tok/manifest.json; fi")


def test_tpu_dry_run_shows_the_tokenize_step_before_staging(fakes):
    r = sh("tpu_sweep.sh", *TPU_ARGS, *TOKENIZE, "--dry-run", "--",
           "--config.data.paths=/tmp/depthbench-data/*.npy", env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 0, r.stderr
    assert calls(fakes) == []
    lines = [shlex.split(line[2:]) for line in r.stdout.splitlines() if line.startswith("+ ")]
    tpu = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "tpu1", *WHERE]
    # mount the bucket, tokenise on worker 0, stage on every worker, then the runs
    assert lines[1] == [*tpu, "--worker=0", "--command", TOKENIZE_COMMAND]
    assert lines[2] == [*tpu, "--worker=all", "--command",
                        "mkdir -p /tmp/depthbench-data && gcloud storage rsync --recursive "
                        "gs://bkt/tok /tmp/depthbench-data"]
    assert "--run pre_ln-L2-lr3e-03" in lines[4][-1]


def test_tpu_tokenize_command_runs_tokenize_once_in_a_shell(fakes, tmp_path):
    """The worker-0 command, run by bash with fake gcloud/depthbench: tokenise, then upload;
    with manifest.json already in the bucket, nothing but the check."""
    home = tmp_path / "home"
    (home / "depthbench" / ".venv" / "bin").mkdir(parents=True)
    tool = home / "depthbench" / ".venv" / "bin" / "depthbench"
    tool.write_text((fakes / "bin" / "depthbench").read_text())
    tool.chmod(0o755)
    out = subprocess.run(["bash", "-c", TOKENIZE_COMMAND], cwd=home, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    seen = [(c["tool"], c["args"][:2]) for c in calls(fakes)]
    assert seen == [("gcloud", ["storage", "ls"]), ("gcloud", ["storage", "rsync"]),
                    ("gcloud", ["storage", "cp"]), ("depthbench", ["data", "tokenize"]),
                    ("gcloud", ["storage", "rsync"]), ("gcloud", ["storage", "cp"])]
    upload = calls(fakes, "gcloud")[-2]["args"]
    assert upload == ["storage", "rsync", "--recursive", "--exclude=manifest\\.json$",
                      "/tmp/depthbench-tokens", "gs://bkt/tok"]  # the manifest goes last
    workers = calls(fakes, "depthbench")[0]["args"]
    assert workers[workers.index("--workers") + 1] == str(os.cpu_count())
    (fakes / "calls.jsonl").unlink()
    (fakes / "finished").write_text("gs://bkt/tok/manifest.json")  # `storage ls` succeeds
    out = subprocess.run(["bash", "-c", TOKENIZE_COMMAND], cwd=home, capture_output=True,
                         text=True)
    assert "already tokenised" in out.stdout
    assert [c["args"][:2] for c in calls(fakes)] == [["storage", "ls"]]


def test_tpu_tokenize_needs_a_tokenizer_and_a_bucket(fakes):
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--tokenize", "gs://bkt/raw", "--stage-data", "gs://b/t")
    assert r.returncode == 2 and "--tokenize needs --tokenizer" in r.stderr
    r = sh("tpu_sweep.sh", *TPU_ARGS, "--tokenize", "gs://bkt/raw", "--tokenizer", "t.json")
    assert r.returncode == 2 and "--tokenize needs --stage-data gs://" in r.stderr
    assert calls(fakes) == []


def test_gpu_in_job_tokenizes_first_unless_done(fakes, tmp_path):
    workdir, tokens = tmp_path / "runs", tmp_path / "tok"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "12",
           "DEPTHBENCH": REAL_DEPTHBENCH}
    args = ["--in-job", "--config", str(REPO / SPEC), "--workdir", str(workdir), "--run",
            PRE_LN[0], "--tokenize-input", "/raw/*.parquet", "--tokenizer", "/tk/tokenizer.json",
            "--tokens-dir", str(tokens), "--", f"--config.data.paths={tokens}/*.npy"]
    r = sh("gpu_sweep.sh", *args, env=env)
    assert r.returncode == 0, r.stderr
    steps = calls(fakes, "srun")
    assert steps[0]["args"] == [
        "--nodes", "1", "--ntasks", "1", "--cpus-per-task", "12", *shlex.split(REAL_DEPTHBENCH),
        "data", "tokenize", "--input", "/raw/*.parquet", "--text-field", "text", "--tokenizer",
        "/tk/tokenizer.json", "--out", str(tokens), "--workers", "12"]
    assert "--task" in steps[1]["args"] and len(steps) == 2
    tokens.mkdir()
    (tokens / "manifest.json").write_text("{}")
    (fakes / "calls.jsonl").unlink()
    r = sh("gpu_sweep.sh", *args, env=env)
    assert r.returncode == 0 and len(calls(fakes, "srun")) == 1  # the run only
    # submit mode forwards the data options to the job
    (fakes / "calls.jsonl").unlink()
    r = sh("gpu_sweep.sh", *args[1:], env={"DEPTHBENCH": REAL_DEPTHBENCH})
    assert r.returncode == 0, r.stderr
    sbatch = calls(fakes, "sbatch")[0]["args"]
    assert sbatch[sbatch.index("--tokens-dir") + 1] == str(tokens)
    r = sh("gpu_sweep.sh", *args[1:7], "--tokenize-input", "/raw/*.parquet")
    assert r.returncode == 2 and "needs --tokenizer FILE and --tokens-dir DIR" in r.stderr


# ---------------------------------------------------------- local multi-process

PROBE = r'''
import json, os, sys, time
keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_PLATFORMS",
        "XLA_FLAGS")
out = os.path.join(sys.argv[1], "env-" + os.environ["JAX_PROCESS_ID"] + ".json")
json.dump({k: os.environ.get(k) for k in keys}, open(out, "w"))
if os.environ["JAX_PROCESS_ID"] == sys.argv[2]:
    sys.exit(3)
if sys.argv[2] != "none":
    time.sleep(60)  # a live process that must be stopped when another fails
'''


def test_local_multiprocess_gives_each_process_its_ids(tmp_path):
    logs = tmp_path / "logs"
    r = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "3",
                        "--devices-per-process", "2", "--port", "23456", "--logs", str(logs),
                        "--", sys.executable, "-c", PROBE, str(tmp_path), "none"],
                       capture_output=True, text=True, timeout=60, env={
                           k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert r.returncode == 0, r.stderr
    for i in range(3):
        env = json.loads((tmp_path / f"env-{i}.json").read_text())
        assert env == {"JAX_COORDINATOR_ADDRESS": "localhost:23456", "JAX_NUM_PROCESSES": "3",
                       "JAX_PROCESS_ID": str(i), "JAX_PLATFORMS": "cpu",
                       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
        assert (logs / f"process-{i}.pid").read_text().strip().isdigit()


def test_local_multiprocess_stops_all_when_one_fails(tmp_path):
    t0 = time.time()
    r = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "3", "--grace", "2",
                        "--logs", str(tmp_path / "logs"), "--", sys.executable, "-c", PROBE,
                        str(tmp_path), "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "process 1 failed (exit 3); stopping the others" in r.stderr
    assert time.time() - t0 < 30  # the sleeping processes were stopped, not waited for
    for i in (0, 2):
        pid = int((tmp_path / "logs" / f"process-{i}.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_local_multiprocess_usage(tmp_path):
    r = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "0", "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "N: expected a positive integer" in r.stderr
    r = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "2"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "no command given" in r.stderr
    r = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "2", "--port", "999",
                        "--logs", str(tmp_path), "--dry-run", "--", "depthbench", "train"],
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert r.stdout.splitlines()[1] == (
        "+ env JAX_COORDINATOR_ADDRESS=localhost:999 JAX_NUM_PROCESSES=2 JAX_PLATFORMS=cpu "
        f"JAX_PROCESS_ID=1 depthbench train > {tmp_path}/process-1.log 2>&1 &")
