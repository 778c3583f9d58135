#!/bin/bash
# Slurm Prolog (runs as root on every node of the job before it starts):
# starts this node's shmcache server for the job, as the job's user, and
# creates the job's session. task_prolog.sh then exports SHMCACHE_PORT,
# SHMCACHE_RUN_DIR and SESSION_ID to every task; epilog.sh drops the session
# and stops the server. In slurm.conf:
#   Prolog=/etc/slurm/shmcache/prolog.sh
#   TaskProlog=/etc/slurm/shmcache/task_prolog.sh
#   Epilog=/etc/slurm/shmcache/epilog.sh
#   PrologFlags=Alloc      # run the prolog on every node at allocation
# Settings: see common.sh.
#
# A cache must never stop a job: a failing Prolog drains the node, so
# failures are reported on stderr (slurmd's log) and the script exits 0.
# The tasks then get SESSION_ID=0 and a port with no server: DatasetCache
# warns once and training reads from the source.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
port=$(( ${SHMCACHE_SLURM_PORT_BASE:-40000} + SLURM_JOB_ID % 20000 ))

write_env() {  # write_env SESSION_ID
  local tmp=$env_file.tmp shm_dir
  # Where the segments are, for epilog.sh should the server not answer then.
  shm_dir=$(admin --server_info --json 2>/dev/null |
            sed -n 's/.*"shm_dir": "\([^"]*\)".*/\1/p')
  {
    echo "SHMCACHE_PORT=$port"
    echo "SHMCACHE_RUN_DIR=$job_dir"
    echo "SESSION_ID=$1"
    echo "SHMCACHE_SESSION_ID=$1"
    echo "SHMCACHE_SHM_DIR=${shm_dir:-/dev/shm}"
  } >"$tmp" && chmod 0644 "$tmp" && mv "$tmp" "$env_file"
}

start() {
  mkdir -p "$state_dir" && chmod 0755 "$state_dir" || return 1
  mkdir -p "$job_dir" || return 1
  chown "$SLURM_JOB_UID:${SLURM_JOB_GID:-$SLURM_JOB_UID}" "$job_dir" &&
    chmod 0700 "$job_dir" || return 1
  local out
  # shellcheck disable=SC2086  # START_ARGS are words on purpose
  out=$(admin --start --log_dir "$job_dir/log" ${SHMCACHE_SLURM_START_ARGS:-} 2>&1) ||
    { say "cannot start the cache server on port $port: $out"; return 1; }
  out=$(admin -g 2>&1) || { say "cannot create a session: $out"; return 1; }
  session=${out##* }
  [[ $session =~ ^[0-9]+$ ]] || { say "unexpected answer to -g: $out"; return 1; }
}

session=0
if start; then
  say "cache server on port $port, session $session"
else
  say "training goes on without the cache"
  admin --stop >/dev/null 2>&1
  session=0
fi
write_env "$session" || say "cannot write $env_file"
exit 0
