#!/usr/bin/env bash
# cache.sh DATASET_PATH [NUM_DEVICES]
#
# Runs NUM_DEVICES (default 4) training processes that share one shmcache
# session: creates the session with `shmcache -g` (or reuses $SESSION_ID,
# a session the server holds, so that a second run starts warm), launches
#   my_training_script.py --num_devices N --device k --session_id S --dataset_path P
# for every k in parallel, waits for all, and fails if any failed. Stopped
# by SIGTERM, SIGINT or SIGHUP, it stops the devices (SIGTERM, then SIGKILL
# for a device still running $SHMCACHE_STOP_GRACE seconds later, default 10)
# and exits 128+signal.
# The server must be running (`shmcache --start`). Extra arguments for the
# training script go in $TRAIN_ARGS (e.g. "--epochs 2").
set -uo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 DATASET_PATH [NUM_DEVICES]" >&2
  exit 1
fi
dataset_path=$1
num_devices=${2:-4}
if ! [[ $num_devices =~ ^[1-9][0-9]*$ ]]; then
  echo "cache.sh: NUM_DEVICES must be a positive integer, got '$num_devices'" >&2
  exit 1
fi
stop_grace=${SHMCACHE_STOP_GRACE:-10}
if ! [[ $stop_grace =~ ^[0-9]{1,6}$ ]]; then
  echo "cache.sh: SHMCACHE_STOP_GRACE must be a whole number of seconds, got '$stop_grace'" >&2
  exit 1
fi
stop_grace=$((10#$stop_grace))  # "08" is 8 s, not bash's octal (an error)
if [ ! -d "$dataset_path" ]; then
  echo "cache.sh: no dataset directory at '$dataset_path'" >&2
  exit 1
fi

here=$(cd "$(dirname "$0")" && pwd)
build=${SHMCACHE_BUILD_DIR:-$here/../build}
# Use the build tree when shmcache is not installed.
if ! command -v shmcache >/dev/null 2>&1 && [ -x "$build/clients/admin/shmcache" ]; then
  PATH=$build/clients/admin:$build/daemon:$PATH
fi
if [ -d "$build/clients/python/shmcache" ]; then
  export PYTHONPATH=$build/clients/python${PYTHONPATH:+:$PYTHONPATH}
fi
python=${PYTHON:-/usr/bin/python3}

if [ -n "${SESSION_ID:-}" ]; then
  # Checked once here, not as one traceback per device.
  if ! [[ $SESSION_ID =~ ^[0-9]{1,10}$ ]] || (( 10#$SESSION_ID > 4294967295 )); then
    echo "cache.sh: SESSION_ID must be a session id from 'shmcache -g' (a number in 0..4294967295), got '$SESSION_ID'; unset it to create a session" >&2
    exit 1
  fi
  session_id=$SESSION_ID
  # A session the server does not hold is refused here too (each device's
  # DatasetCache would raise NotFoundError). 0 is no session, and a server
  # that does not answer is left to the devices: both read from the source.
  # So is a listing this check does not understand (or a Python that does
  # not run): only exit code 3, "not in the listing", refuses.
  listed_rc=0
  if (( 10#$session_id != 0 )) && listing=$(shmcache --list_sessions --json 2>/dev/null); then
    "$python" -c 'import json, sys
try:
    held = {s["session"] for s in json.load(sys.stdin)}
except Exception:
    sys.exit(0)
sys.exit(0 if int(sys.argv[1]) in held else 3)' "$session_id" <<<"$listing" || listed_rc=$?
  fi
  if [ "$listed_rc" -eq 3 ]; then
    echo "cache.sh: session $session_id does not exist on the cache server (port ${SHMCACHE_PORT:-50052}); list them with 'shmcache --list_sessions', or unset SESSION_ID to create one" >&2
    exit 1
  fi
else
  result=$(shmcache -g)
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "cache.sh: generating a session failed (rc $rc); is the server started? (shmcache --start)" >&2
    exit $rc
  fi
  session_id=$(echo "$result" | awk '{print $NF}')
fi
echo "cache.sh: session $session_id, $num_devices devices, dataset $dataset_path"
# DatasetCache() and CachedDataset(ds) find the session here.
export SHMCACHE_SESSION_ID=$session_id

pids=()
# Stopped (a scheduler's SIGTERM, Ctrl-C, a closed terminal), cache.sh stops
# its devices: nothing else would, and a device started with & ignores the
# terminal's SIGINT.
# shellcheck disable=SC2317  # called by the traps below
stop() {
  trap - TERM INT HUP
  # Only devices still running: the pid of one that ended was freed when
  # bash reaped it, and may be another process's now.
  local -a live
  mapfile -t live < <(jobs -rp)
  local s=s
  [ ${#live[@]} -eq 1 ] && s=
  echo "cache.sh: stopped by SIG$1; stopping the ${#live[@]} device$s still running" >&2
  [ ${#live[@]} -gt 0 ] && kill -TERM "${live[@]}" 2>/dev/null
  # A device that ignores SIGTERM (or hangs in its handler) must not keep
  # cache.sh, and the job it belongs to, alive for good. The grace is
  # counted in sleeps, so it is never shorter than said: $SECONDS ticks on
  # whole seconds, and a deadline taken from it came anywhere from 0 to 1 s
  # early (a device that was exiting was SIGKILLed and named); EPOCHREALTIME
  # needs bash 5, and clusters still run 4.4.
  local running i k
  for ((i = 0; i < stop_grace * 10; i++)); do
    running=$(jobs -rp)
    [ -n "$running" ] || break
    sleep 0.1
  done
  running=" $(jobs -rp | tr '\n' ' ')"
  for k in "${!pids[@]}"; do
    if [[ $running == *" ${pids[$k]} "* ]]; then
      echo "cache.sh: device $k (pid ${pids[$k]}) still ran ${stop_grace}s after SIGTERM; killing it" >&2
      kill -KILL "${pids[$k]}" 2>/dev/null
    fi
  done
  wait
  exit $((128 + $2))
}
trap 'stop TERM 15' TERM
trap 'stop INT 2' INT
trap 'stop HUP 1' HUP
for ((k = 0; k < num_devices; k++)); do
  # shellcheck disable=SC2086
  "$python" "$here/my_training_script.py" --num_devices "$num_devices" \
    --device "$k" --session_id "$session_id" --dataset_path "$dataset_path" \
    ${TRAIN_ARGS:-} &
  pids+=($!)
done

failed=0
for k in "${!pids[@]}"; do
  if ! wait "${pids[$k]}"; then
    echo "cache.sh: device $k failed" >&2
    failed=1
  fi
done
exit $failed
