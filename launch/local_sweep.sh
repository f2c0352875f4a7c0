#!/usr/bin/env bash
# Run a depthbench sweep as several processes on one machine, one --shard each.
#
#   launch/local_sweep.sh --config experiments/micro_all.py --workdir runs/micro_all --procs 4
#   launch/local_sweep.sh --config experiments/paper_400m.py --workdir runs/400m \
#       --gpus 0,1,2,3,4,5,6,7 -- --config.data.paths='/data/fineweb_edu/*.npy'
#
# Process i runs `depthbench sweep --shard i/N` (every N-th run), logging to
# DIR/logs/shard-i-of-N.log; with --gpus each process sees one GPU (CUDA_VISIBLE_DEVICES),
# without it the processes share the CPU (--cpus-per-proc pins each to its own cores with
# taskset) and run with DEPTHBENCH_MALLOC=mimalloc unless it is set.  Every process keeps DIR/results.csv up to date; this script prints a summary
# of it every --interval seconds until all processes end, then (--report) the report.
# Ctrl-C stops the processes it started; re-running resumes (finished runs are skipped).
# Exit status: 0 all processes succeeded, 1 one failed (see its log), 2 bad usage.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/local_sweep.sh --config SPEC --workdir DIR [options] [-- OVERRIDES...]

  --procs N             number of sweep processes (default: number of --gpus, else 2)
  --gpus LIST           comma-separated GPU ids; process i gets GPU LIST[i mod len]
  --cpus-per-proc K     CPU only: pin process i to cores i*K .. i*K+K-1 (needs taskset)
  --interval S          seconds between progress summaries (default 30)
  --report              run `depthbench report DIR` at the end
  --dry-run             print every command instead of running it
  -- OVERRIDES          --config.section.field=value arguments passed to every run
environment: DEPTHBENCH  the depthbench command (default depthbench)

examples:
  launch/local_sweep.sh --config experiments/micro_all.py --workdir runs/micro_all --procs 2 --report
  launch/local_sweep.sh --config experiments/quickstart.py --workdir runs/qs --procs 4 \
      --cpus-per-proc 2 --dry-run
  launch/local_sweep.sh --config experiments/paper_400m.py --workdir runs/400m \
      --gpus 0,1,2,3,4,5,6,7 -- --config.data.paths='/data/fineweb_edu/*.npy'
EOF
}

die() { echo "local_sweep.sh: error: $*" >&2; exit 2; }
# An option without its value is bad usage (exit 2, like an unknown one), not
# bash's own ${2:?} failure (exit 1).
need() { if (($# < 2)) || [[ -z "$2" ]]; then usage >&2; die "$1 needs a value"; fi; }

SPEC="" WORKDIR="" PROCS="" GPUS="" CPUS_PER=0 INTERVAL=30 REPORT=0 DRY=0
OVERRIDES=()
while (($#)); do
  case "$1" in
    --config) need "$@"; SPEC="$2"; shift 2 ;;
    --workdir) need "$@"; WORKDIR="$2"; shift 2 ;;
    --procs) need "$@"; PROCS="$2"; shift 2 ;;
    --gpus) need "$@"; GPUS="$2"; shift 2 ;;
    --cpus-per-proc) need "$@"; CPUS_PER="$2"; shift 2 ;;
    --interval) need "$@"; INTERVAL="$2"; shift 2 ;;
    --report) REPORT=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    --config.*) OVERRIDES+=("$1"); shift ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

[[ -n "$SPEC" ]] || die "--config SPEC is required"
[[ -n "$WORKDIR" ]] || die "--workdir DIR is required"
[[ -f "$SPEC" ]] || die "--config: spec file '$SPEC' does not exist"
IFS=, read -r -a GPU_IDS <<<"$GPUS"
[[ -n "$PROCS" ]] || PROCS=$((${#GPU_IDS[@]} > 0 ? ${#GPU_IDS[@]} : 2))
[[ "$PROCS" =~ ^[1-9][0-9]*$ ]] || die "--procs: expected a positive integer, got '$PROCS'"
[[ "$CPUS_PER" =~ ^[0-9]+$ ]] || die "--cpus-per-proc: expected an integer, got '$CPUS_PER'"
[[ "$INTERVAL" =~ ^[1-9][0-9]*$ ]] || die "--interval: expected a positive integer"
if ((CPUS_PER > 0)) && ! command -v taskset >/dev/null; then
  die "--cpus-per-proc needs taskset (util-linux)"
fi
read -r -a DEPTHBENCH_CMD <<<"${DEPTHBENCH:-depthbench}"
LOGS="$WORKDIR/logs"

q() {  # one word, shell-quoted only if it needs it
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

command_of() {  # the command of process $1 (an env prefix, maybe taskset, depthbench)
  local i=$1 cmd=(env)
  if ((${#GPU_IDS[@]})); then
    cmd+=("CUDA_VISIBLE_DEVICES=${GPU_IDS[$((i % ${#GPU_IDS[@]}))]}")
  else  # CPU steps: mimalloc keeps XLA's per-step buffer mapped (bench/results/hostmem.md)
    cmd+=(JAX_PLATFORMS=cpu "DEPTHBENCH_MALLOC=${DEPTHBENCH_MALLOC:-mimalloc}")
  fi
  if ((CPUS_PER > 0)); then
    cmd+=(taskset -c "$((i * CPUS_PER))-$((i * CPUS_PER + CPUS_PER - 1))")
  fi
  cmd+=("${DEPTHBENCH_CMD[@]}" sweep --config "$SPEC" --workdir "$WORKDIR"
        --shard "$i/$PROCS" --no-progress "${OVERRIDES[@]}")
  printf '%s\0' "${cmd[@]}"
}

summary() {  # status counts of results.csv (its last column)
  [[ -f "$WORKDIR/results.csv" ]] || { echo "no results.csv yet"; return; }
  awk -F, 'NR > 1 { n[$NF]++; t++ }
           END { printf "%d runs:", t; for (s in n) printf " %d %s", n[s], s; print "" }' \
    "$WORKDIR/results.csv"
}

if ((DRY)); then
  echo "+ mkdir -p $(q "$LOGS")"
  for ((i = 0; i < PROCS; i++)); do
    mapfile -d '' cmd < <(command_of "$i")
    printf '+'
    for word in "${cmd[@]}"; do printf ' %s' "$(q "$word")"; done
    printf ' > %s 2>&1 &\n' "$(q "$LOGS/shard-$i-of-$PROCS.log")"
  done
  if ((REPORT)); then
    printf '+'
    for word in "${DEPTHBENCH_CMD[@]}" report "$WORKDIR"; do printf ' %s' "$(q "$word")"; done
    printf '\n'
  fi
  exit 0
fi

mkdir -p "$LOGS"
PIDS=()
# shellcheck disable=SC2317,SC2329  # called by the trap below
stop() {
  echo "local_sweep.sh: stopping ${#PIDS[@]} sweep processes" >&2
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
  exit 130
}
trap stop INT TERM

for ((i = 0; i < PROCS; i++)); do
  mapfile -d '' cmd < <(command_of "$i")
  "${cmd[@]}" >"$LOGS/shard-$i-of-$PROCS.log" 2>&1 &
  PIDS+=($!)
  echo "local_sweep.sh: shard $i/$PROCS pid $! log $LOGS/shard-$i-of-$PROCS.log" >&2
done

alive() {
  local pid
  for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
elapsed=0
while alive; do
  sleep 1
  elapsed=$((elapsed + 1))
  if ((elapsed % INTERVAL == 0)) && alive; then echo "[$(date +%H:%M:%S)] $(summary)" >&2; fi
done

FAILED=0
for i in "${!PIDS[@]}"; do
  if ! wait "${PIDS[$i]}"; then
    echo "local_sweep.sh: shard $i/$PROCS failed; see $LOGS/shard-$i-of-$PROCS.log" >&2
    FAILED=1
  fi
done
echo "local_sweep.sh: $(summary)" >&2
if ((REPORT)); then "${DEPTHBENCH_CMD[@]}" report "$WORKDIR" || FAILED=1; fi
exit "$FAILED"
