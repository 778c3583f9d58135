#!/usr/bin/env bash
# The multi-device shared-cache demo on data it generates: installs what is
# missing, builds, starts a cache server, runs 4 device processes on one
# session, shows that the host holds one copy of the rows, and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/lib/common.sh
ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}"
build_demo build

export PATH=$root/build/clients/admin:$root/build/daemon:$PATH
export SHMCACHE_PORT=${SHMCACHE_PORT:-50099}
devices=4

# The servers' run dir (socket, lock, logs): the user's when given, else one
# of the demo's own, removed at the end so that the demo leaves nothing
# behind (kept when it fails: the logs say why). In /tmp, as the default
# one, whatever $TMPDIR says: a socket's path may not pass 107 bytes.
made_run_dir=
if [[ -z ${SHMCACHE_RUN_DIR:-} ]]; then
  SHMCACHE_RUN_DIR=$(mktemp -d /tmp/shmcache-demo-run.XXXXXX)
  export SHMCACHE_RUN_DIR
  made_run_dir=$SHMCACHE_RUN_DIR
fi
data_dir=
cleanup() {
  local status=$?
  shmcache --stop >/dev/null 2>&1 || true
  if [[ -n $data_dir ]]; then rm -rf "$data_dir"; fi
  if [[ -n $made_run_dir ]]; then
    # Kept only when it failed and a server wrote a log there.
    if [[ $status -eq 0 || -z $(find "$made_run_dir" -type f -name '*.log' -print -quit) ]]; then
      rm -rf "$made_run_dir"
    else
      echo "demo.sh: failed (exit status $status); the servers' run dir, with their logs, is kept: $made_run_dir" >&2
    fi
  fi
}
trap cleanup EXIT

echo "== shmcache --start"
shmcache --start
session=$(shmcache -g | awk '{print $NF}')
echo "session: $session"

# held SESSION DATASET_ROWS: what the session's caches hold and counted, in
# words, from --list_sessions --json.
held() {
  shmcache --list_sessions --json | /usr/bin/python3 -c '
import json, sys
session, rows, devices = map(int, sys.argv[1:])
caches = [c for s in json.load(sys.stdin) if s["session"] == session for c in s["caches"]]
held = sum(c["mem_cached"] for c in caches)
mb = sum(c["mem_bytes"] for c in caches) / 2**20
hits = sum(c["hits"] for c in caches)
misses = sum(c["misses"] for c in caches)
print(f"The host holds {held} rows ({mb:.1f} MB) for {devices} devices reading a "
      f"{rows}-row dataset: one copy, not {devices}. Reads over all devices: {hits} "
      f"hits (served from shared memory), {misses} misses (loaded and put).")
' "$1" "$2" "$devices"
}

echo "== $devices C++ device processes share session $session (20000 rows of 3 KB):"
echo "   epoch 1 reads each device's shard (misses: loaded, put), epoch 2 every row (hits)"
pids=()
for ((k = 0; k < devices; k++)); do
  build/examples/shard_worker --session_id "$session" --device $k \
    --num_devices $devices --rows 20000 --row_bytes 3072 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

echo "== shmcache --list_sessions (the rows are held once, however many readers)"
shmcache --list_sessions
held "$session" 20000
shmcache --server_info

echo "== shmcache -d $session && shmcache --stop"
shmcache -d "$session"
shmcache --stop
left=$(find /dev/shm -maxdepth 1 -name "shmcache.$(id -u).$SHMCACHE_PORT.*" | wc -l)
echo "shared-memory files left in /dev/shm: $left"

echo
echo "== Python: scripts/cache.sh, $devices PyTorch device processes on one session"
data_dir=$(mktemp -d "${TMPDIR:-/tmp}/shmcache-demo.XXXXXX")
PYTHONPATH=$root/build/clients/python${PYTHONPATH:+:$PYTHONPATH} \
  /usr/bin/python3 scripts/my_training_script.py --generate 20000 \
  --dataset_path "$data_dir/cifar10"
shmcache --start
export SHMCACHE_BUILD_DIR=$root/build
now() { date +%s.%N; }
t0=$(now)
scripts/cache.sh "$data_dir/cifar10" $devices | tee "$data_dir/cold.log"
t1=$(now)
session=$(awk '/^cache.sh: session/ {print $3; exit}' "$data_dir/cold.log" | tr -d ,)
SESSION_ID=$session scripts/cache.sh "$data_dir/cifar10" $devices | tee "$data_dir/warm.log"
t2=$(now)
cold=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
warm=$(awk -v a="$t1" -v b="$t2" 'BEGIN {printf "%.2f", b - a}')
echo "cache.sh cold run (samples decoded and put): $cold s; warm run (same session $session, samples read from the cache): $warm s"
echo "(each run includes starting $devices Python processes that import torch)"
epochs() { awk '/epoch 1:/ {printf "%s ", $(NF-1)}' "$1"; }
echo "per-device epoch seconds, the data loop alone: cold $(epochs "$data_dir/cold.log")| warm $(epochs "$data_dir/warm.log")"

echo "== shmcache --list_sessions (20000 rows: one copy for $devices devices)"
shmcache --list_sessions
held "$session" 20000
shmcache --stop
