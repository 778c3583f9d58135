#!/bin/bash
# Slurm Epilog (runs as root on every node of the job after it ends): drops
# the job's session and stops this node's server, which removes its shared
# memory, then removes the job's state. A server that does not answer is
# terminated and its shared-memory files removed. Always exits 0 (a failing
# Epilog drains the node); problems go to stderr (slurmd's log).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
[ -r "$env_file" ] || exit 0
port=$(sed -n 's/^SHMCACHE_PORT=//p' "$env_file")
session=$(sed -n 's/^SESSION_ID=//p' "$env_file")
[[ $port =~ ^[0-9]+$ ]] || { say "no port in $env_file"; rm -f "$env_file"; exit 0; }

shm_dir=$(sed -n 's/^SHMCACHE_SHM_DIR=//p' "$env_file")
# The server's pid, from its instance lock; only while it is a shmcached
# (a dead server's pid may belong to another process by now).
pid=$(cat "$job_dir/shmcached-$port.lock" 2>/dev/null)
running() {
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = shmcached ]
}

if running; then
  if [ "${session:-0}" != 0 ]; then
    out=$(admin -d "$session" 2>&1) || say "cannot drop session $session: $out"
  fi
  if ! out=$(admin --stop 2>&1); then
    say "the server did not stop ($out); terminating process $pid"
    for sig in TERM KILL; do
      kill -"$sig" "$pid" 2>/dev/null
      for _ in $(seq 100); do running || break; sleep 0.1; done
    done
  fi
fi
# A server that died or was killed leaves its segments: they are this job's.
# Started as root without a shm dir, it kept them in a huge-page tmpfs of
# its own, left mounted: unmount it (never through a symlink).
if ! running; then
  rm -f "${shm_dir:-/dev/shm}/shmcache.$SLURM_JOB_UID.$port."*
  huge=/dev/shm/shmcache.$SLURM_JOB_UID.$port.huge
  if [ "$shm_dir" = "$huge" ] && [ -d "$huge" ] && [ ! -L "$huge" ]; then
    if mountpoint -q "$huge"; then
      umount "$huge" 2>/dev/null || umount -l "$huge" || say "cannot unmount $huge"
    fi
    rmdir "$huge" 2>/dev/null
  fi
fi
rm -rf "$job_dir" "$env_file"
exit 0
