#!/usr/bin/env bash
# Runs train_gpt on N data-parallel ranks on this machine with mpirun, adding what Open MPI needs here:
# --allow-run-as-root when run as root, --oversubscribe when N exceeds this machine's cores (unless
# ZERO_MPIRUN_ARGS names hosts), and --bind-to none; each rank gets one CPU thread (--threads 1) unless
# the flags say otherwise. Installs what is missing and builds first, like scripts/train.sh, and
# without --data (and without --resume) trains on Tiny Shakespeare (downloaded when missing).
#   scripts/launch.sh -n N [--max-restarts K [--min-ranks M]] [train_gpt flags...]
#   e.g. scripts/launch.sh -n 4 --zero-stage 2 --dtype fp16 --steps 50
# SIGTERM or SIGINT (Ctrl-C) to this script reaches every rank as a stop request (SIGUSR1 through
# mpirun): they stop after the same step, save a checkpoint when --save-dir is given, and this script
# exits with 128 + the signal; a second one abandons that checkpoint, a third ends mpirun at once.
# --max-restarts K: when the job fails because a rank died (killed, crashed), relaunch it from the
# newest checkpoint in --save-dir, at most K times; --min-ranks M: if Open MPI can then start fewer than
# N ranks (hosts gone), relaunch with the most it can start, at least M, that the global batch splits
# into. ZERO_MPIRUN_ARGS adds mpirun options (e.g. "--hostfile hosts"). ZERO_MAX_STEPS caps the steps.
# On a cluster you may call mpirun directly:
#   mpirun -np 16 --hostfile hosts build/bin/train_gpt --data data/tinyshakespeare.txt --zero-stage 2
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage="usage: scripts/launch.sh -n N [--max-restarts K [--min-ranks M]] [train_gpt flags...]"
n=""
case "${1:-}" in
  -n|-np|--np) [ $# -ge 2 ] || { echo "error: $1 needs a number; $usage" >&2; exit 2; }; n="$2"; shift 2 ;;
  -n*) n="${1#-n}"; shift ;;
  -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
  *) echo "error: the first argument must be -n N (ranks); $usage" >&2; exit 2 ;;
esac
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "error: -n '$n' is not a positive number of ranks; $usage" >&2; exit 2; }

# The launcher's own options, wherever they are; everything else goes to train_gpt.
max_restarts=0 min_ranks="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --max-restarts|--min-ranks)
      [ $# -ge 2 ] || { echo "error: $1 needs a number; $usage" >&2; exit 2; }
      [[ "$2" =~ ^[0-9]+$ ]] || { echo "error: $1 '$2' is not a number; $usage" >&2; exit 2; }
      if [ "$1" = --max-restarts ]; then max_restarts=$2; else min_ranks=$2; fi
      shift 2 ;;
    --max-restarts=*|--min-ranks=*)
      v="${1#*=}"
      [[ "$v" =~ ^[0-9]+$ ]] || { echo "error: ${1%%=*} '$v' is not a number; $usage" >&2; exit 2; }
      if [ "${1%%=*}" = --max-restarts ]; then max_restarts=$v; else min_ranks=$v; fi
      shift ;;
    *) args+=("$1"); shift ;;
  esac
done
min_ranks=${min_ranks:-$n}
if [ "$min_ranks" -lt 1 ] || [ "$min_ranks" -gt "$n" ]; then
  echo "error: --min-ranks $min_ranks must be between 1 and -n $n; $usage" >&2
  exit 2
fi

has_data=0 has_threads=0 has_resume=0 save_dir=""
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --data|--data=*) has_data=1 ;;
    --threads|--threads=*) has_threads=1 ;;
    --resume|--resume=*) has_resume=1 ;;
    --save-dir) save_dir="${args[i + 1]:-}" ;;
    --save-dir=*) save_dir="${args[i]#--save-dir=}" ;;
  esac
done
if [ "$max_restarts" -gt 0 ] && [ -z "$save_dir" ]; then
  echo "error: --max-restarts needs --save-dir DIR (a restart continues from the newest checkpoint there); $usage" >&2
  exit 2
fi
# A resumed run takes its data file from the checkpoint.
want_corpus=0
[ $has_data = 0 ] && [ $has_resume = 0 ] && want_corpus=1
extra=()
[ $want_corpus = 1 ] && [ ! -f "$ZERO_CORPUS" ] && ! zero_has_downloader && extra=(curl ca-certificates)
"$ZERO_ROOT/scripts/setup.sh" "${extra[@]}"
flags=()
if [ $want_corpus = 1 ]; then
  zero_fetch_corpus "scripts/launch.sh -n $n --data path/to.txt ..."
  flags+=(--data "$ZERO_CORPUS")
fi
[ $has_threads = 0 ] && flags+=(--threads 1)
zero_build

names_hosts=0
[[ " ${ZERO_MPIRUN_ARGS:-} " =~ \ (--hostfile|--machinefile|--host|-H|--default-hostfile)[\ =] ]] && names_hosts=1
# mpirun's options for `ranks` ranks.
mpirun_args() {
  local ranks=$1
  m=(-np "$ranks" --bind-to none)
  [ "$(id -u)" = 0 ] && m+=(--allow-run-as-root)
  [ $names_hosts = 0 ] && [ "$ranks" -gt "$(nproc)" ] && m+=(--oversubscribe)
  # shellcheck disable=SC2206  # word splitting of the user's extra options is intended
  [ -n "${ZERO_MPIRUN_ARGS:-}" ] && m+=($ZERO_MPIRUN_ARGS)
  return 0
}

# Stop requests: mpirun would abort the job on SIGTERM/SIGINT (SIGKILL one second later), so they go to
# the ranks as SIGUSR1, which mpirun forwards unchanged (Note [Preemption] in examples/preemption.cpp).
# mpirun runs in a session of its own, so a Ctrl-C at the terminal reaches this script only.
mpirun_pid="" stop_signal="" stop_count=0 interrupted=0
forward_stop() {
  interrupted=1
  stop_signal=$1
  stop_count=$((stop_count + 1))
  [ -n "$mpirun_pid" ] || return 0
  if [ $stop_count -le 2 ]; then
    echo "launch: $stop_signal: asking every rank to stop (SIGUSR1 to mpirun)$([ $stop_count = 2 ] && echo ", now, without saving")" >&2
    kill -USR1 "$mpirun_pid" 2>/dev/null || true
  else
    echo "launch: $stop_signal again: ending mpirun" >&2
    kill -TERM "$mpirun_pid" 2>/dev/null || true
  fi
}
trap 'forward_stop SIGTERM' TERM
trap 'forward_stop SIGINT' INT

# run_job RANKS ARGS...: one mpirun; sets `rc` to its exit status (the wait is resumed after a trapped
# signal interrupts it).
run_job() {
  local ranks=$1
  shift
  mpirun_args "$ranks"
  echo "launch: mpirun ${m[*]} $ZERO_BUILD/bin/train_gpt ${flags[*]} $*"
  # For train_gpt's "resume with:" line: this launcher, less the flags it adds.
  ZERO_LAUNCHER="$0 -n $ranks$([ "$max_restarts" -gt 0 ] && echo " --max-restarts $max_restarts --min-ranks $min_ranks")" \
    ZERO_LAUNCHER_ARGS=${#flags[@]} setsid mpirun "${m[@]}" "$ZERO_BUILD/bin/train_gpt" "${flags[@]}" "$@" &
  mpirun_pid=$!
  while :; do
    interrupted=0
    if wait "$mpirun_pid"; then rc=0; else rc=$?; fi
    [ $interrupted = 1 ] || break  # a trapped signal ends the wait early: wait again
  done
  mpirun_pid=""
}

# The number of ranks Open MPI can start now, from `ranks` down to --min-ranks, that `batch` (the
# global batch over the accumulation steps; 0: unknown) splits into; 0 if none.
startable_ranks() {
  local ranks=$1 batch=$2 r
  for ((r = ranks; r >= min_ranks; --r)); do
    [ "$batch" -gt 0 ] && [ $((batch % r)) -ne 0 ] && continue
    mpirun_args "$r"
    if mpirun "${m[@]}" true >/dev/null 2>&1; then echo "$r"; return 0; fi
  done
  echo 0
}

# The newest checkpoint in the save directory ("" if none) and its global batch per accumulation step.
newest_checkpoint() {
  local d newest=""
  for d in "$save_dir"/step_[0-9]*; do  # a step_ directory is complete once it has that name
    [ -f "$d/state.json" ] && newest=$d  # the glob sorts: the last is the newest
  done
  echo "$newest"
}
checkpoint_batch() {
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]
print(c["train_batch_size"] // c["gradient_accumulation_steps"])' "$1/state.json" 2>/dev/null || echo 0
}

ranks=$n attempt=0 start=$SECONDS
run_args=("${args[@]}")
while :; do
  run_job "$ranks" "${run_args[@]}"
  [ "$rc" = 0 ] && exit 0
  if [ -n "$stop_signal" ]; then
    [ "$stop_signal" = SIGINT ] && exit 130
    exit 143
  fi
  # Which failures a restart can mend: a rank that died (mpirun: 128 + its signal), but not a stop
  # request (SIGINT, SIGUSR1, SIGTERM: 130, 138, 143) nor an error train_gpt reported (1, 2: a relaunch
  # would meet it again).
  if [ "$rc" -le 128 ] || [ "$rc" = 130 ] || [ "$rc" = 138 ] || [ "$rc" = 143 ]; then exit "$rc"; fi
  if [ "$attempt" -ge "$max_restarts" ]; then
    [ "$max_restarts" -gt 0 ] && echo "launch: the job failed (mpirun exit $rc) and all $max_restarts restart(s) are used; giving up" >&2
    exit "$rc"
  fi
  attempt=$((attempt + 1))
  ckpt=$(newest_checkpoint)
  batch=0
  [ -n "$ckpt" ] && batch=$(checkpoint_batch "$ckpt")
  next=$(startable_ranks "$n" "$batch")
  if [ "$next" = 0 ]; then
    echo "launch: the job failed (mpirun exit $rc) and Open MPI cannot start $min_ranks or more ranks now; giving up" >&2
    exit "$rc"
  fi
  run_args=()
  for ((i = 0; i < ${#args[@]}; ++i)); do  # the user's flags less any --resume
    case "${args[i]}" in
      --resume) i=$((i + 1)) ;;
      --resume=*) ;;
      *) run_args+=("${args[i]}") ;;
    esac
  done
  if [ -n "$ckpt" ]; then
    run_args+=(--resume "$save_dir")
    from="from $ckpt"
  else
    run_args=("${args[@]}")
    from="from the start (no checkpoint in $save_dir yet)"
  fi
  echo "launch: a rank died (mpirun exit $rc, signal $((rc - 128))) after $((SECONDS - start)) s; restart $attempt of $max_restarts $from on $next rank(s)" >&2
  ranks=$next
done
