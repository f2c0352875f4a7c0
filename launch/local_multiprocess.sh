#!/usr/bin/env bash
# Run one command as N cooperating JAX processes on this machine (multi-host, rehearsed locally).
#
#   launch/local_multiprocess.sh 2 -- depthbench train --config experiments/micro.py \
#       --workdir runs/mp2
#   launch/local_multiprocess.sh 4 --devices-per-process 2 -- depthbench train \
#       --config experiments/micro.py --workdir runs/mp4x2 --config.parallel.fsdp=4 \
#       --config.parallel.tensor=2
#
# Process i gets JAX_COORDINATOR_ADDRESS=localhost:PORT, JAX_NUM_PROCESSES=N and
# JAX_PROCESS_ID=i (depthbench passes all three to jax.distributed.initialize and uses
# gloo for CPU collectives), JAX_PLATFORMS=cpu unless set, and with --devices-per-process D
# XLA_FLAGS=--xla_force_host_platform_device_count=D (D CPU devices per process).
# Process 0 writes to this terminal; process i > 0 to LOGS/process-i.log; each one's pid is
# in LOGS/process-i.pid.
# If any process fails, the others are stopped (TERM, then KILL after --grace seconds) and
# the script exits with the first failure's status, naming its log.  SIGTERM / Ctrl-C are
# passed to every process (the trainer then saves a checkpoint at the same step on all).
# Exit status: 0 all succeeded, the failing process's status otherwise, 2 bad usage.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/local_multiprocess.sh N [options] -- COMMAND [ARGS...]

  N                        number of processes (>= 1)
  --devices-per-process D  CPU devices per process (XLA_FLAGS host platform device count)
  --port P                 coordinator port (default: a free one)
  --logs DIR               logs of processes 1..N-1 (default: a new temporary directory)
  --grace S                seconds between TERM and KILL when stopping the others (default 30)
  --dry-run                print the commands instead of running them
EOF
}

die() { echo "local_multiprocess.sh: error: $*" >&2; exit 2; }
# An option without its value is bad usage (exit 2, like an unknown one), not
# bash's own ${2:?} failure (exit 1).
need() { if (($# < 2)) || [[ -z "$2" ]]; then usage >&2; die "$1 needs a value"; fi; }

N="" DEVICES="" PORT="" LOGS="" GRACE=30 DRY=0
while (($#)); do
  case "$1" in
    --devices-per-process) need "$@"; DEVICES="$2"; shift 2 ;;
    --port) need "$@"; PORT="$2"; shift 2 ;;
    --logs) need "$@"; LOGS="$2"; shift 2 ;;
    --grace) need "$@"; GRACE="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) usage >&2; die "unknown argument '$1'" ;;
    *) [[ -z "$N" ]] || die "unexpected argument '$1' (the command goes after --)"; N="$1"; shift ;;
  esac
done
[[ -n "$N" ]] || { usage >&2; die "the number of processes N is required"; }
[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "N: expected a positive integer, got '$N'"
[[ -z "$DEVICES" || "$DEVICES" =~ ^[1-9][0-9]*$ ]] \
  || die "--devices-per-process: expected a positive integer, got '$DEVICES'"
[[ "$GRACE" =~ ^[0-9]+$ ]] || die "--grace: expected a non-negative integer, got '$GRACE'"
(($#)) || die "no command given (put it after --)"
if [[ -z "$PORT" ]]; then
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
[[ "$PORT" =~ ^[0-9]+$ ]] || die "--port: expected a port number, got '$PORT'"
[[ -n "$LOGS" ]] || LOGS=$(mktemp -d "${TMPDIR:-/tmp}/depthbench-mp.XXXXXX")
mkdir -p "$LOGS"

ENVS=(JAX_COORDINATOR_ADDRESS="localhost:$PORT" JAX_NUM_PROCESSES="$N"
      JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}")
[[ -z "$DEVICES" ]] || ENVS+=(XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=$DEVICES")

PIDS=()
stop_all() {  # TERM every live process, then KILL those still alive after GRACE seconds
  local pid waited=0
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  while ((waited < GRACE * 10)); do
    local alive=0
    for pid in "${PIDS[@]}"; do
      if kill -0 "$pid" 2>/dev/null && [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" != Z* ]]; then
        alive=1
      fi
    done
    ((alive)) || return 0
    sleep 0.1
    waited=$((waited + 1))
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
# shellcheck disable=SC2317,SC2329  # invoked by the traps below
on_signal() {
  echo "local_multiprocess.sh: passing $1 to all $N processes" >&2
  for pid in "${PIDS[@]}"; do kill -"$1" "$pid" 2>/dev/null || true; done
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

for ((i = 0; i < N; i++)); do
  log="$LOGS/process-$i.log"
  if ((DRY)); then
    printf '+ env'
    for word in "${ENVS[@]}" JAX_PROCESS_ID="$i" "$@"; do printf ' %q' "$word"; done
    ((i == 0)) && printf ' &\n' || printf ' > %q 2>&1 &\n' "$log"
    continue
  fi
  if ((i == 0)); then
    env "${ENVS[@]}" JAX_PROCESS_ID="$i" "$@" &
  else
    env "${ENVS[@]}" JAX_PROCESS_ID="$i" "$@" >"$log" 2>&1 &
  fi
  PIDS+=($!)
  echo "$!" >"$LOGS/process-$i.pid"  # to signal one process (e.g. kill -TERM: all stop)
done
((DRY)) && exit 0

# Poll the processes; the first failure stops the rest.  (Polling, not `wait -n`: bash may
# reap a child stopped by stop_all before `wait -n` sees it, which would then never return.)
STATUS=0 FAILED=""
remaining=("${!PIDS[@]}")
while ((${#remaining[@]})); do
  next=()
  for i in "${remaining[@]}"; do
    if kill -0 "${PIDS[$i]}" 2>/dev/null && [[ "$(ps -o stat= -p "${PIDS[$i]}" 2>/dev/null)" != Z* ]]; then
      next+=("$i")
      continue
    fi
    code=0
    wait "${PIDS[$i]}" 2>/dev/null || code=$?
    if ((code != 0 && STATUS == 0)); then
      STATUS=$code FAILED=$i
      echo "local_multiprocess.sh: process $i failed (exit $code); stopping the others" >&2
      if ((i > 0)); then
        echo "--- last lines of $LOGS/process-$i.log ---" >&2
        tail -n 20 "$LOGS/process-$i.log" >&2 || true
      fi
      stop_all
    fi
  done
  remaining=("${next[@]}")
  ((${#remaining[@]})) && sleep 0.2
done
((STATUS == 0)) || echo "local_multiprocess.sh: failed (process $FAILED); logs in $LOGS" >&2
exit "$STATUS"
