#!/usr/bin/env bash
# Run a depthbench sweep on a SLURM GPU cluster, one multi-node job step per run.
#
#   launch/gpu_sweep.sh --config experiments/paper_400m.py --workdir /shared/runs/400m \
#       --nodes 4 --gpus-per-node 8 --partition gpu --time 48:00:00 \
#       -- --config.data.paths='/shared/fineweb_edu/*.npy'
#
# Three modes of this one script:
#   (default)  submit: `sbatch` this script with --in-job into an allocation of --nodes nodes;
#   --in-job   inside the allocation: for each run of the sweep that has no result.json yet,
#              `srun` one task per node (--task) running `depthbench sweep --run NAME --no-lock`
#              (every process trains the same run together), then `depthbench report`;
#   --task     inside one srun task: export the JAX coordinator address (first node of the
#              step, port --port + run index) and process ids from SLURM's variables, exec.
# --tokenize-input GLOB --tokenizer FILE --tokens-dir DIR: inside the job, before the runs,
# one srun task runs `depthbench data tokenize` into DIR (skipped once DIR/manifest.json
# exists; resumable), on --cpus-per-task cores; point --config.data.paths at 'DIR/*.npy'.
# The workdir must be on a filesystem every node sees.  The job is submitted with --requeue:
# after a preemption or a time-out SLURM (or you) starts it again, finished runs are skipped
# and the interrupted one resumes from its last checkpoint.  --dry-run prints the sbatch
# command and every run's srun step (it lists the runs here; the venv need not exist).
# Exit status: 0 every run finished, 1 some run failed (see RUN/failure.txt), 2 bad usage.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/gpu_sweep.sh --config SPEC --workdir DIR [options] [-- OVERRIDES...]

allocation (sbatch):
  --nodes N             nodes per run (default 1); one process per node sees all its GPUs
  --gpus-per-node G     GPUs per node (default 8)
  --cpus-per-task C     CPU cores per process (default 16)
  --partition P  --account A  --qos Q
  --time T              wall-clock limit (default 24:00:00)
  --job-name NAME       (default depthbench-sweep)
  --sbatch-arg ARG      any further sbatch argument (repeatable)
data (on a filesystem every node sees):
  --tokenize-input GLOB raw Parquet / JSON-lines files to tokenise before the runs
  --tokenizer FILE      tokenizer.json or SentencePiece .model for --tokenize-input
  --tokens-dir DIR      where the shards go (skipped if DIR/manifest.json exists)
  --text-field F        column / JSON field holding the text (default text)
run:
  --venv DIR            activate this virtualenv on every node (default: depthbench on PATH)
  --port P              base coordinator port; run k uses P + k mod 1000 (default 29500)
  --shard i/N           only this shard of the runs (N jobs split one sweep)
  --run NAME            only these runs (repeatable; shell patterns allowed)
  --dry-run             print every command instead of running it
  -- OVERRIDES          --config.section.field=value arguments passed to every run
environment: DEPTHBENCH  the depthbench command (default depthbench)

examples:
  launch/gpu_sweep.sh --config experiments/paper_400m.py --workdir /shared/runs/400m \
      --nodes 2 --gpus-per-node 8 --partition gpu --time 48:00:00 --venv ~/venvs/depthbench \
      -- --config.data.paths='/shared/fineweb_edu/*.npy'
  launch/gpu_sweep.sh --config experiments/quickstart.py --workdir /shared/runs/qs --dry-run
  launch/gpu_sweep.sh --config experiments/paper_400m.py --workdir /shared/runs/400m \
      --nodes 4 --shard 0/2 --run 'hc-*' -- --config.data.paths='/shared/tok/*.npy'
EOF
}

die() { echo "gpu_sweep.sh: error: $*" >&2; exit 2; }
# An option without its value is bad usage (exit 2, like an unknown one), not
# bash's own ${2:?} failure (exit 1).
need() { if (($# < 2)) || [[ -z "$2" ]]; then usage >&2; die "$1 needs a value"; fi; }

SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
MODE=submit SPEC="" WORKDIR="" NODES=1 GPUS=8 CPUS=16 TIME=24:00:00 JOB=depthbench-sweep
PARTITION="" ACCOUNT="" QOS="" VENV="" PORT=29500 SHARD="" DRY=0
SBATCH_EXTRA=() RUN_ARGS=() OVERRIDES=()
TOKENIZE_INPUT="" TOKENIZER="" TOKENS_DIR="" TEXT_FIELD=text

while (($#)); do
  case "$1" in
    --config) need "$@"; SPEC="$2"; shift 2 ;;
    --workdir) need "$@"; WORKDIR="$2"; shift 2 ;;
    --nodes) need "$@"; NODES="$2"; shift 2 ;;
    --gpus-per-node) need "$@"; GPUS="$2"; shift 2 ;;
    --cpus-per-task) need "$@"; CPUS="$2"; shift 2 ;;
    --partition) need "$@"; PARTITION="$2"; shift 2 ;;
    --account) need "$@"; ACCOUNT="$2"; shift 2 ;;
    --qos) need "$@"; QOS="$2"; shift 2 ;;
    --time) need "$@"; TIME="$2"; shift 2 ;;
    --job-name) need "$@"; JOB="$2"; shift 2 ;;
    --sbatch-arg) need "$@"; SBATCH_EXTRA+=("$2"); shift 2 ;;
    --tokenize-input) need "$@"; TOKENIZE_INPUT="$2"; shift 2 ;;
    --tokenizer) need "$@"; TOKENIZER="$2"; shift 2 ;;
    --tokens-dir) need "$@"; TOKENS_DIR="$2"; shift 2 ;;
    --text-field) need "$@"; TEXT_FIELD="$2"; shift 2 ;;
    --venv) need "$@"; VENV="$2"; shift 2 ;;
    --port) need "$@"; PORT="$2"; shift 2 ;;
    --shard) need "$@"; SHARD="$2"; shift 2 ;;
    --run) need "$@"; RUN_ARGS+=(--run "$2"); shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --in-job) MODE=in-job; shift ;;
    --task) MODE=task; shift; [[ "${1:-}" != -- ]] || shift; break ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    --config.*) OVERRIDES+=("$1"); shift ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

# ------------------------------------------------------------------ --task (one srun task)
if [[ "$MODE" == task ]]; then
  (($#)) || die "--task needs the command to run after it"
  : "${SLURM_PROCID:?--task runs inside srun (SLURM_PROCID is not set)}"
  nodelist=${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}}
  # Read every name, then take the first: `| head -n 1` would close the pipe early and
  # (with pipefail) turn scontrol's SIGPIPE into a failure.
  hosts=()
  mapfile -t hosts < <(scontrol show hostnames "$nodelist")
  coordinator=${hosts[0]:-}
  [[ -n "$coordinator" ]] || die "scontrol gave no host for node list '$nodelist'"
  # jax.distributed.initialize() reads JAX_COORDINATOR_ADDRESS; the process count and id
  # come from SLURM_NTASKS / SLURM_PROCID (exported below under JAX's names as well).
  export JAX_COORDINATOR_ADDRESS="$coordinator:${DEPTHBENCH_COORD_PORT:-$PORT}"
  export JAX_NUM_PROCESSES="${SLURM_NTASKS:-1}" JAX_PROCESS_ID="$SLURM_PROCID"
  if [[ -n "${SLURM_LOCALID:-}" ]]; then export JAX_LOCAL_PROCESS_ID="$SLURM_LOCALID"; fi
  exec "$@"
fi

[[ -n "$SPEC" ]] || die "--config SPEC is required"
[[ -n "$WORKDIR" ]] || die "--workdir DIR is required (on a filesystem every node sees)"
[[ -f "$SPEC" ]] || die "--config: spec file '$SPEC' does not exist"
for n in "$NODES" "$GPUS" "$CPUS" "$PORT"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--nodes/--gpus-per-node/--cpus-per-task/--port:" \
    "expected a positive integer, got '$n'"
done
if [[ -n "$TOKENIZE_INPUT" ]]; then
  [[ -n "$TOKENIZER" && -n "$TOKENS_DIR" ]] \
    || die "--tokenize-input needs --tokenizer FILE and --tokens-dir DIR"
  TOKENIZER=$(realpath -m "$TOKENIZER") TOKENS_DIR=$(realpath -m "$TOKENS_DIR")
fi
SPEC=$(realpath "$SPEC")
[[ "$WORKDIR" == *://* ]] || WORKDIR=$(realpath -m "$WORKDIR")
read -r -a DEPTHBENCH_CMD <<<"${DEPTHBENCH:-depthbench}"

# One word, shell-quoted only if it needs it (printed commands stay readable and pastable).
q() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

run() {  # print (dry run) or run a command
  if ((DRY)); then
    printf '+'
    for word in "$@"; do printf ' %s' "$(q "$word")"; done
    printf '\n'
  else
    "$@"
  fi
}

# ------------------------------------------------------------------------ submit
if [[ "$MODE" == submit ]]; then
  forward=(--config "$SPEC" --workdir "$WORKDIR" --port "$PORT" "${RUN_ARGS[@]}")
  [[ -z "$SHARD" ]] || forward+=(--shard "$SHARD")
  [[ -z "$TOKENIZE_INPUT" ]] || forward+=(--tokenize-input "$TOKENIZE_INPUT" --tokenizer
    "$TOKENIZER" --tokens-dir "$TOKENS_DIR" --text-field "$TEXT_FIELD")
  if [[ -n "$VENV" ]]; then
    # A dry run only shows the commands; a submission needs the venv the nodes will use.
    ((DRY)) || [[ -f "$VENV/bin/activate" ]] \
      || die "--venv: '$VENV' is not a virtualenv (no bin/activate); create it first"
    forward+=(--venv "$(realpath -m "$VENV")")
  fi
  args=(--job-name "$JOB" --nodes "$NODES" --ntasks-per-node 1 --gpus-per-node "$GPUS"
        --cpus-per-task "$CPUS" --time "$TIME" --requeue --signal B:TERM@120
        --output "$WORKDIR/logs/%x-%j.out")
  [[ -z "$PARTITION" ]] || args+=(--partition "$PARTITION")
  [[ -z "$ACCOUNT" ]] || args+=(--account "$ACCOUNT")
  [[ -z "$QOS" ]] || args+=(--qos "$QOS")
  run mkdir -p "$WORKDIR/logs"
  run sbatch "${args[@]}" "${SBATCH_EXTRA[@]}" "$SCRIPT" --in-job "${forward[@]}" \
    -- "${OVERRIDES[@]}"
  ((DRY)) || exit 0
  # The dry run goes on to show what the job will run in its allocation.
  echo "gpu_sweep.sh: dry run: inside the job, for each run without result.json:" >&2
  SLURM_JOB_ID=dry-run
fi

# ------------------------------------------------------------------------ --in-job
: "${SLURM_JOB_ID:?--in-job runs inside an sbatch allocation (SLURM_JOB_ID is not set)}"
if [[ -n "$VENV" ]] && ((DRY)); then
  run source "$VENV/bin/activate"
elif [[ -n "$VENV" ]]; then
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
fi
NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-$NODES}}
# The data step: one task tokenises the raw corpus (resumable; skipped once it is done).
if [[ -n "$TOKENIZE_INPUT" && ! -f "$TOKENS_DIR/manifest.json" ]]; then
  run srun --nodes 1 --ntasks 1 --cpus-per-task "${SLURM_CPUS_PER_TASK:-$CPUS}" \
    "${DEPTHBENCH_CMD[@]}" data tokenize --input "$TOKENIZE_INPUT" --text-field "$TEXT_FIELD" \
    --tokenizer "$TOKENIZER" --out "$TOKENS_DIR" --workers "${SLURM_CPUS_PER_TASK:-$CPUS}" \
    || die "tokenising $TOKENIZE_INPUT into $TOKENS_DIR failed (re-submit to resume it)"
fi
list=(sweep --config "$SPEC" --workdir "$WORKDIR" --list "${RUN_ARGS[@]}")
[[ -z "$SHARD" ]] || list+=(--shard "$SHARD")
RUN_LIST=$("${DEPTHBENCH_CMD[@]}" "${list[@]}" "${OVERRIDES[@]}") \
  || die "could not list the sweep's runs"
mapfile -t RUNS <<<"$RUN_LIST"
[[ -n "${RUNS[0]:-}" ]] || die "the selection has no runs"
echo "gpu_sweep.sh: job $SLURM_JOB_ID, ${#RUNS[@]} runs on $NNODES nodes -> $WORKDIR" >&2

STEP_PID=""
# SIGTERM (time limit, preemption) reaches this batch shell first: pass it to the running
# step so the trainer can stop cleanly, then wait for it.
on_term() {
  if [[ -n "$STEP_PID" ]]; then kill -TERM "$STEP_PID" 2>/dev/null || true; wait "$STEP_PID" || true; fi
  exit 143
}
trap on_term TERM

FAILED=() DONE=0
for k in "${!RUNS[@]}"; do
  name=${RUNS[$k]}
  if [[ -f "$WORKDIR/$name/result.json" ]]; then
    echo "[$((k + 1))/${#RUNS[@]}] $name: finished, skipped" >&2
    DONE=$((DONE + 1))
    continue
  fi
  echo "[$((k + 1))/${#RUNS[@]}] $name" >&2
  export DEPTHBENCH_COORD_PORT=$((PORT + k % 1000))  # a fresh port per step: no TIME_WAIT clash
  step=(srun --nodes "$NNODES" --ntasks-per-node 1 --kill-on-bad-exit=1 "$SCRIPT" --task --
        "${DEPTHBENCH_CMD[@]}" sweep --config "$SPEC" --workdir "$WORKDIR" --run "$name"
        --no-lock --no-progress "${OVERRIDES[@]}")
  status=0
  if ((DRY)); then
    run "${step[@]}"
  else
    "${step[@]}" &
    STEP_PID=$!
    wait "$STEP_PID" || status=$?
    STEP_PID=""
  fi
  if ((status)); then FAILED+=("$name"); else DONE=$((DONE + 1)); fi
done

run "${DEPTHBENCH_CMD[@]}" report "$WORKDIR" || true
if ((DRY)); then
  echo "gpu_sweep.sh: dry run: ${#RUNS[@]} runs listed, nothing was run" >&2
  exit 0
fi
echo "gpu_sweep.sh: $DONE/${#RUNS[@]} runs finished${FAILED:+, failed: ${FAILED[*]}}" >&2
((${#FAILED[@]} == 0))
