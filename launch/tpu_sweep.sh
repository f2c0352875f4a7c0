#!/usr/bin/env bash
# Run a depthbench sweep on a Cloud TPU VM slice, one multi-host job per run.
#
#   launch/tpu_sweep.sh --config experiments/paper_400m.py --workdir gs://BUCKET/400m \
#       --tpu depthbench-v5p --zone us-east5-a --project my-proj --accelerator v5p-64 \
#       --create --spot --tokenize gs://BUCKET/fineweb-edu/sample/10BT \
#       --tokenizer gs://BUCKET/gpt-neox-20b/tokenizer.json --stage-data gs://BUCKET/fineweb_edu_neox \
#       -- --config.data.paths='/tmp/depthbench-data/*.npy'
#
# What it does, in order (with --dry-run every gcloud command is printed, none is run):
#   1. lists the sweep's runs here (`depthbench sweep --list`; needs this checkout installed);
#   2. --create: creates the slice unless it exists;
#   3. --install (implied by --create): copies this checkout to every worker and installs it
#      with JAX for TPU in a virtualenv (<remote-dir>/.venv);
#   --tokenize: unless --stage-data already holds a manifest.json, worker 0 copies the raw
#      files (Parquet/JSON lines) and --tokenizer to its disk, runs `depthbench data tokenize`
#      on all its cores (resumable) and copies the shards + manifest.json to --stage-data;
#   --stage-data: copies token shards from a bucket to the same local directory on every
#      worker (the data pipeline reads local files; point --config.data.paths there);
#   4. lists finished runs in the bucket (one `gcloud storage ls`) and skips them;
#   --workdir gs://BUCKET/DIR is mounted with gcsfuse at $DEPTHBENCH_GCS_MOUNT/BUCKET (default
#      /tmp/depthbench-gcs) on every worker; the workers read and write the runs there;
#   5. for each remaining run: `depthbench sweep --run NAME --no-lock` on ALL workers at
#      once (one multi-host job: jax.distributed.initialize() finds the slice by itself);
#      run directories (Orbax checkpoints, TensorBoard events, result.json) go to the bucket;
#   6. `depthbench report` on worker 0; --delete removes the slice at the end.
# Preemption: a run whose command fails while the slice is not READY is resumed after the
# slice is recreated (with --create; up to --retries times); otherwise re-run this script:
# finished runs are skipped and an interrupted run resumes from its last checkpoint.
# Exit status: 0 every run finished, 1 some run failed (see RUN/failure.txt), 2 bad usage.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/tpu_sweep.sh --config SPEC --workdir gs://BUCKET/DIR [options] [-- OVERRIDES...]

slice (flag, or environment variable):
  --tpu NAME            TPU_NAME           slice name
  --zone ZONE           TPU_ZONE           e.g. us-central2-b
  --project PROJECT     TPU_PROJECT        GCP project (default: gcloud's configured one)
  --accelerator TYPE    TPU_ACCELERATOR    e.g. v4-32, v5p-64, v6e-16 (needed by --create)
  --version VERSION     TPU_VERSION        TPU VM runtime (default tpu-ubuntu2204-base)
  --create              create the slice if it does not exist (implies --install)
  --spot                create it as a Spot slice (cheaper, preemptible)
  --delete              delete the slice when the sweep is done
install:
  --install             copy this checkout to every worker and pip-install it
  --remote-dir DIR      checkout directory on the workers, relative to home (default depthbench)
  --jax SPEC            pip requirement for JAX on TPU (default 'jax[tpu]>=0.10,<0.12')
data:
  --tokenize URL        raw corpus (gs://... or a path on worker 0): tokenise it into
                        --stage-data first (skipped when that holds manifest.json)
  --tokenizer URL       tokenizer.json or SentencePiece .model (gs://... or a worker path)
  --tokenize-glob PAT   which raw files, relative to --tokenize (default '**/*.parquet')
  --text-field F        the column / JSON field holding the text (default text)
  --stage-data URL      copy gs://... (recursively) to --stage-dir on every worker first
  --stage-dir DIR       local directory for it (default /tmp/depthbench-data)
sweep:
  --shard i/N           only this shard of the runs (N slices split one sweep)
  --run NAME            only these runs (repeatable; shell patterns allowed)
  --retries N           recreate a preempted slice and resume, at most N times (default 3)
  --dry-run             print every command instead of running it
  -- OVERRIDES          --config.section.field=value arguments passed to every run
environment: DEPTHBENCH  the local depthbench command used to list runs (default depthbench)

examples:
  launch/tpu_sweep.sh --config experiments/paper_400m.py --workdir gs://BUCKET/400m \
      --tpu depthbench-v5p --zone us-east5-a --project PROJECT --accelerator v5p-64 \
      --create --spot --stage-data gs://BUCKET/fineweb_edu_neox \
      -- --config.data.paths='/tmp/depthbench-data/*.npy'
  launch/tpu_sweep.sh --config experiments/quickstart.py --workdir gs://BUCKET/qs \
      --tpu my-v4 --zone us-central2-b --run 'hc-*' --dry-run
  TPU_NAME=my-v4 TPU_ZONE=us-central2-b launch/tpu_sweep.sh \
      --config experiments/quickstart.py --workdir gs://BUCKET/qs --shard 1/2 --delete
EOF
}

die() { echo "tpu_sweep.sh: error: $*" >&2; exit 2; }
# An option without its value is bad usage (exit 2, like an unknown one), not
# bash's own ${2:?} failure (exit 1).
need() { if (($# < 2)) || [[ -z "$2" ]]; then usage >&2; die "$1 needs a value"; fi; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SPEC="" WORKDIR="${DEPTHBENCH_WORKDIR:-}"
TPU="${TPU_NAME:-}" ZONE="${TPU_ZONE:-${ZONE:-}}"
PROJECT="${TPU_PROJECT:-${CLOUDSDK_CORE_PROJECT:-}}"
ACCEL="${TPU_ACCELERATOR:-}" VERSION="${TPU_VERSION:-tpu-ubuntu2204-base}"
CREATE=0 SPOT=0 DELETE=0 INSTALL=0 DRY=0 RETRIES=3 SHARD=""
REMOTE_DIR="depthbench" JAX_REQ='jax[tpu]>=0.10,<0.12'
STAGE_DATA="" STAGE_DIR=/tmp/depthbench-data
TOKENIZE="" TOKENIZER="" TOKENIZE_GLOB='**/*.parquet' TEXT_FIELD=text
RAW_DIR=/tmp/depthbench-raw TOKENS_DIR=/tmp/depthbench-tokens
MOUNT_ROOT="${DEPTHBENCH_GCS_MOUNT:-/tmp/depthbench-gcs}"
RUN_ARGS=() OVERRIDES=()

while (($#)); do
  case "$1" in
    --config) need "$@"; SPEC="$2"; shift 2 ;;
    --workdir) need "$@"; WORKDIR="$2"; shift 2 ;;
    --tpu) need "$@"; TPU="$2"; shift 2 ;;
    --zone) need "$@"; ZONE="$2"; shift 2 ;;
    --project) need "$@"; PROJECT="$2"; shift 2 ;;
    --accelerator) need "$@"; ACCEL="$2"; shift 2 ;;
    --version) need "$@"; VERSION="$2"; shift 2 ;;
    --create) CREATE=1 INSTALL=1; shift ;;
    --spot) SPOT=1; shift ;;
    --delete) DELETE=1; shift ;;
    --install) INSTALL=1; shift ;;
    --remote-dir) need "$@"; REMOTE_DIR="$2"; shift 2 ;;
    --jax) need "$@"; JAX_REQ="$2"; shift 2 ;;
    --stage-data) need "$@"; STAGE_DATA="$2"; shift 2 ;;
    --stage-dir) need "$@"; STAGE_DIR="$2"; shift 2 ;;
    --tokenize) need "$@"; TOKENIZE="$2"; shift 2 ;;
    --tokenizer) need "$@"; TOKENIZER="$2"; shift 2 ;;
    --tokenize-glob) need "$@"; TOKENIZE_GLOB="$2"; shift 2 ;;
    --text-field) need "$@"; TEXT_FIELD="$2"; shift 2 ;;
    --shard) need "$@"; SHARD="$2"; shift 2 ;;
    --run) need "$@"; RUN_ARGS+=(--run "$2"); shift 2 ;;
    --retries) need "$@"; RETRIES="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    --config.*) OVERRIDES+=("$1"); shift ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

[[ -n "$SPEC" ]] || die "--config SPEC is required"
[[ -n "$WORKDIR" ]] || die "--workdir is required (a gs:// bucket path every worker can write)"
[[ -n "$TPU" ]] || die "--tpu NAME (or TPU_NAME) is required"
[[ -n "$ZONE" ]] || die "--zone ZONE (or TPU_ZONE) is required"
[[ "$RETRIES" =~ ^[0-9]+$ ]] || die "--retries: expected a non-negative integer, got '$RETRIES'"
if [[ -n "$TOKENIZE" ]]; then
  [[ -n "$TOKENIZER" ]] || die "--tokenize needs --tokenizer (a tokenizer.json or .model)"
  [[ "$STAGE_DATA" == gs://* ]] || die "--tokenize needs --stage-data gs://... (where the" \
    "shards go, for every worker to copy)"
fi
if ((CREATE)) && [[ -z "$ACCEL" ]]; then
  die "--create needs --accelerator TYPE (or TPU_ACCELERATOR), e.g. v5p-64"
fi
[[ "$WORKDIR" == gs://* ]] || echo "tpu_sweep.sh: note: --workdir $WORKDIR is not a gs:// bucket;" \
  "every worker must see the same directory" >&2
[[ -f "$SPEC" ]] || die "--config: spec file '$SPEC' does not exist"
REL_SPEC=$(realpath --relative-to="$REPO" "$SPEC")
[[ "$REL_SPEC" != ../* ]] || die "--config: '$SPEC' is outside this checkout ($REPO);" \
  "the workers get a copy of the checkout, so put the spec under experiments/"

# The checkout's own virtualenv (README's install) unless DEPTHBENCH says otherwise.
DEFAULT_DEPTHBENCH=depthbench
[[ -x "$REPO/.venv/bin/depthbench" ]] && DEFAULT_DEPTHBENCH="$REPO/.venv/bin/depthbench"
read -r -a DEPTHBENCH_CMD <<<"${DEPTHBENCH:-$DEFAULT_DEPTHBENCH}"
GCLOUD_TPU=(gcloud compute tpus tpu-vm)
WHERE=(--zone "$ZONE")
[[ -z "$PROJECT" ]] || WHERE+=(--project "$PROJECT")
REMOTE_BIN=".venv/bin/depthbench"

# One word, shell-quoted only if it needs it (printed commands stay readable and pastable).
q() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Print (dry run) or run a command.
run() {
  if ((DRY)); then
    printf '+'
    for word in "$@"; do printf ' %s' "$(q "$word")"; done
    printf '\n'
  else
    "$@"
  fi
}

# The command string a worker runs: cd into the checkout, then the quoted arguments.
remote() {
  local out word
  out="cd $(q "$REMOTE_DIR") &&"
  for word in "$@"; do out+=" $(q "$word")"; done
  printf '%s' "$out"
}

on_workers() {  # on_workers WORKER COMMAND-STRING
  run "${GCLOUD_TPU[@]}" ssh "$TPU" "${WHERE[@]}" --worker="$1" --command "$2"
}

slice_state() {  # READY, PREEMPTED, CREATING, ... or nothing if the slice does not exist
  "${GCLOUD_TPU[@]}" describe "$TPU" "${WHERE[@]}" --format='value(state)' 2>/dev/null || true
}

create_slice() {
  local args=(create "$TPU" "${WHERE[@]}" --accelerator-type "$ACCEL" --version "$VERSION")
  ((SPOT)) && args+=(--spot)
  run "${GCLOUD_TPU[@]}" "${args[@]}"
}

install() {
  local tarball=/tmp/depthbench-src-$$.tgz
  run tar -czf "$tarball" --exclude=.git --exclude=.venv --exclude=runs --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude=.pytest_cache -C "$REPO" .
  run "${GCLOUD_TPU[@]}" scp "$tarball" "$TPU:/tmp/depthbench-src.tgz" "${WHERE[@]}" --worker=all
  local setup
  local dir
  dir=$(q "$REMOTE_DIR")
  setup="mkdir -p $dir && tar -xzf /tmp/depthbench-src.tgz -C $dir && cd $dir && "
  setup+="(test -x .venv/bin/python || python3 -m venv .venv) && "
  setup+=".venv/bin/pip install -q -U pip && "
  setup+=".venv/bin/pip install -q -e . $(q "$JAX_REQ") gcsfs google-cloud-storage"
  if [[ "$WORKDIR" == gs://* ]]; then  # gcsfuse mounts the bucket (see mount_bucket)
    setup+=" && (command -v gcsfuse >/dev/null || (sudo apt-get update -qq && "
    setup+="sudo apt-get install -y -qq gcsfuse))"
  fi
  on_workers all "$setup"
  ((DRY)) || rm -f "$tarball"
}

# The trainer writes its run directory with ordinary file I/O (append-only metrics, atomic
# renames, lock files), so a gs:// work directory is mounted with gcsfuse at the same path
# on every worker and the workers are given that path; listing finished runs still asks
# the bucket directly.
RUN_WORKDIR="$WORKDIR"
if [[ "$WORKDIR" == gs://* ]]; then
  BUCKET=${WORKDIR#gs://}
  BUCKET=${BUCKET%%/*}
  RUN_WORKDIR="$MOUNT_ROOT/${WORKDIR#gs://}"
fi

mount_bucket() {
  [[ "$WORKDIR" == gs://* ]] || return 0
  local at
  at=$(q "$MOUNT_ROOT/$BUCKET")
  on_workers all "mkdir -p $at && (mountpoint -q $at || gcsfuse --implicit-dirs $(q "$BUCKET") $at)"
}

tokenize_data() {  # worker 0 tokenises the raw corpus into --stage-data, unless it is there
  [[ -n "$TOKENIZE" ]] || return 0
  local raw tok out fetch
  raw=$(q "$RAW_DIR") out=$(q "$TOKENS_DIR")
  if [[ "$TOKENIZE" == gs://* ]]; then
    fetch="mkdir -p $raw && gcloud storage rsync --recursive $(q "$TOKENIZE") $raw && "
  else
    fetch="" raw=$(q "$TOKENIZE")
  fi
  if [[ "$TOKENIZER" == gs://* ]]; then
    tok="$RAW_DIR-tokenizer/$(basename "$TOKENIZER")"  # beside the raw files, not among them
    fetch+="mkdir -p $(q "$RAW_DIR-tokenizer") && gcloud storage cp $(q "$TOKENIZER") $(q "$tok") && "
  else
    tok=$TOKENIZER
  fi
  local cmd
  cmd="if gcloud storage ls $(q "$STAGE_DATA/manifest.json") >/dev/null 2>&1; then "
  cmd+="echo $(q "$STAGE_DATA already tokenised"); else $fetch"
  cmd+="cd $(q "$REMOTE_DIR") && $REMOTE_BIN data tokenize --input $(q "$raw/$TOKENIZE_GLOB")"
  cmd+=" --text-field $(q "$TEXT_FIELD") --tokenizer $(q "$tok") --out $out"
  # manifest.json last: the bucket holds one only when every shard is there
  cmd+=" --workers \$(nproc) && gcloud storage rsync --recursive --exclude='manifest\.json\$'"
  cmd+=" $out $(q "$STAGE_DATA") && gcloud storage cp $out/manifest.json"
  cmd+=" $(q "$STAGE_DATA/manifest.json"); fi"
  on_workers 0 "$cmd"
}

stage_data() {  # every worker gets the same local copy of the token shards
  [[ -n "$STAGE_DATA" ]] || return 0
  on_workers all "mkdir -p $(q "$STAGE_DIR") && gcloud storage rsync --recursive $(q "$STAGE_DATA") $(q "$STAGE_DIR")"
}

# 1. the runs of this sweep (or shard), listed here; read-only, so it also runs in a dry run
LIST_ARGS=(sweep --config "$SPEC" --workdir "$WORKDIR" --list "${RUN_ARGS[@]}")
[[ -z "$SHARD" ]] || LIST_ARGS+=(--shard "$SHARD")
if ! RUN_LIST=$(cd "$REPO" && "${DEPTHBENCH_CMD[@]}" "${LIST_ARGS[@]}" "${OVERRIDES[@]}"); then
  die "could not list the sweep's runs with '${DEPTHBENCH_CMD[*]} ${LIST_ARGS[*]}'"
fi
mapfile -t RUNS <<<"$RUN_LIST"
[[ -n "${RUNS[0]:-}" ]] || die "the selection has no runs"
echo "tpu_sweep.sh: ${#RUNS[@]} runs of $REL_SPEC on $TPU -> $WORKDIR" >&2

# 2-3. slice and install
if ((CREATE)); then
  if ((DRY)) || [[ -z "$(slice_state)" ]]; then
    create_slice
  fi
fi
((INSTALL)) && install
mount_bucket
tokenize_data
stage_data

# 4. finished runs (result.json in the bucket) are skipped without starting a job
FINISHED=""
if [[ "$WORKDIR" == gs://* ]]; then
  if ((DRY)); then
    run gcloud storage ls "$WORKDIR/*/result.json"
  else
    FINISHED=$(gcloud storage ls "$WORKDIR/*/result.json" 2>/dev/null || true)
  fi
fi

recover() {  # after a failed run: 0 = retry it, 1 = the run itself failed (slice READY)
  local state
  state=$(slice_state)
  [[ "$state" == READY ]] && return 1
  if ((!CREATE)); then
    echo "tpu_sweep.sh: slice $TPU is '${state:-gone}'; re-run with --create to recreate it" \
      "(finished runs are skipped, interrupted ones resume)" >&2
    exit 1
  fi
  echo "tpu_sweep.sh: slice $TPU is '${state:-gone}': recreating it" >&2
  [[ -z "$state" ]] || run "${GCLOUD_TPU[@]}" delete "$TPU" "${WHERE[@]}" --quiet
  create_slice
  install
  mount_bucket
  tokenize_data
  stage_data
  return 0
}

# 5. one multi-host job per run
FAILED=() DONE=0
for k in "${!RUNS[@]}"; do
  name=${RUNS[$k]}
  if [[ -n "$FINISHED" ]] && grep -qF "/$name/result.json" <<<"$FINISHED"; then
    echo "[$((k + 1))/${#RUNS[@]}] $name: finished, skipped" >&2
    DONE=$((DONE + 1))
    continue
  fi
  echo "[$((k + 1))/${#RUNS[@]}] $name" >&2
  cmd=$(remote "$REMOTE_BIN" sweep --config "$REL_SPEC" --workdir "$RUN_WORKDIR" --run "$name" \
    --no-lock --no-progress "${OVERRIDES[@]}")
  attempt=0
  until on_workers all "$cmd"; do
    attempt=$((attempt + 1))
    if ((attempt > RETRIES)) || ! recover; then
      FAILED+=("$name")
      break
    fi
    echo "[$((k + 1))/${#RUNS[@]}] $name: resuming (attempt $((attempt + 1)))" >&2
  done
  [[ " ${FAILED[*]} " == *" $name "* ]] || DONE=$((DONE + 1))
done

# 6. the report, written by worker 0 next to the runs
on_workers 0 "$(remote "$REMOTE_BIN" report "$RUN_WORKDIR")" || true
((DELETE)) && run "${GCLOUD_TPU[@]}" delete "$TPU" "${WHERE[@]}" --quiet

if ((DRY)); then
  echo "tpu_sweep.sh: dry run: ${#RUNS[@]} runs listed, nothing was run" >&2
else
  echo "tpu_sweep.sh: $DONE/${#RUNS[@]} runs finished${FAILED:+, failed: ${FAILED[*]}}" >&2
fi
((${#FAILED[@]} == 0))
