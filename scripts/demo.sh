#!/usr/bin/env bash
# The multi-device shared-cache demo on data it generates: installs what is
# missing, builds, starts a cache server, runs 4 device processes on one
# session, shows that the host holds one copy of the rows, and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/lib/common.sh
ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}"
build_project build

export PATH=$root/build/clients/admin:$root/build/daemon:$PATH
export SHMCACHE_PORT=${SHMCACHE_PORT:-50099}
devices=4

echo "== shmcache --start"
shmcache --start
trap 'shmcache --stop >/dev/null 2>&1 || true' EXIT
session=$(shmcache -g | awk '{print $NF}')
echo "session: $session"

echo "== $devices C++ device processes share session $session (20000 rows of 3 KB)"
pids=()
for ((k = 0; k < devices; k++)); do
  build/examples/shard_worker --session_id "$session" --device $k \
    --num_devices $devices --rows 20000 --row_bytes 3072 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

echo "== shmcache --list_sessions (the rows are held once, however many readers)"
shmcache --list_sessions
shmcache --server_info

echo "== shmcache -d $session && shmcache --stop"
shmcache -d "$session"
shmcache --stop
trap - EXIT
left=$(ls /dev/shm | grep -c "^shmcache\.$(id -u)\.$SHMCACHE_PORT\." || true)
echo "shared-memory files left in /dev/shm: $left"
