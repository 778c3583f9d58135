#!/bin/bash
# Slurm Prolog (runs as root on every node of the job before it starts):
# starts this node's shmcache server for the job, as the job's user, and
# creates the job's session. task_prolog.sh then exports SHMCACHE_PORT,
# SHMCACHE_RUN_DIR, SESSION_ID and SHMCACHE_SESSION_ID to every task;
# epilog.sh drops the session and stops the server. In slurm.conf:
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
#
# Run as root for another user, it writes only in the state dir (its own,
# checked by state_dir_ok), creates files there exclusively (mktemp) and
# replaces them by rename, so a link planted anywhere is never followed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=examples/slurm/common.sh
source "$here/common.sh"
first_port=$(( ${SHMCACHE_SLURM_PORT_BASE:-40000} + SLURM_JOB_ID % 20000 ))
port=$first_port

# Ports the env files of the node's other live jobs name (root's files).
ports_in_use() {
  local f
  for f in "$state_dir"/job*.env; do
    [ "$f" = "$env_file" ] && continue
    [ -f "$f" ] && [ ! -L "$f" ] && timeout 5 sed -n 's/^SHMCACHE_PORT=//p' "$f"
  done
}

write_env() {  # write_env SESSION_ID
  local tmp shm_dir
  # Where the segments are, for epilog.sh should the server not answer then.
  # The answer comes through the job user's run dir, so it is the user's to
  # forge: one absolute path on one line, else /dev/shm (a second line would
  # be a second entry in root's env file).
  shm_dir=$(admin --server_info --json 2>/dev/null |
            sed -n 's/.*"shm_dir": "\([^"]*\)".*/\1/p' | head -n 1)
  [[ $shm_dir == /* ]] || shm_dir=/dev/shm
  tmp=$(mktemp "$state_dir/.job$SLURM_JOB_ID.env.XXXXXX") || return 1
  if ! {
    echo "SHMCACHE_PORT=$port"
    echo "SHMCACHE_RUN_DIR=$job_dir"
    echo "SESSION_ID=$1"
    echo "SHMCACHE_SESSION_ID=$1"
    echo "SHMCACHE_SHM_DIR=${shm_dir:-/dev/shm}"
  } >"$tmp" || ! chmod 0644 "$tmp" || ! mv -fT "$tmp" "$env_file"; then
    rm -f "$tmp"
    return 1
  fi
}

# make_job_dir: job<ID>/ anew, 0700, the job user's (a stale one of an
# earlier job with this id is removed: remove_job_dir).
make_job_dir() {
  remove_job_dir && mkdir -m 0700 "$job_dir" &&
    chown -h "$SLURM_JOB_UID:${SLURM_JOB_GID:-$SLURM_JOB_UID}" "$job_dir"
}

start() {
  make_job_dir || return 1
  local out used tries
  used=" $(ports_in_use | tr '\n' ' ') "
  # Another job of this node may hold the first port (job ids N and N+20000
  # of one user, or a server that outlived its job), or another user may
  # have put a lock file there (the port follows from the job id, which
  # every user sees; the server refuses a lock not its user's): take the
  # next free one.
  for (( tries = 0; tries < 64; ++tries )); do
    port=$(( first_port + tries ))
    (( port > 65535 )) && port=$(( port - 64512 ))
    [[ $used == *" $port "* ]] && continue
    # shellcheck disable=SC2086  # START_ARGS are words on purpose
    if out=$(admin --start --log_dir "$job_dir/log" ${SHMCACHE_SLURM_START_ARGS:-} 2>&1)
    then
      break
    fi
    port_taken "$out" ||
      { say "cannot start the cache server on port $port: $out"; return 1; }
  done
  (( tries < 64 )) || { say "no free port from $first_port: $out"; return 1; }
  out=$(admin -g 2>&1) || { say "cannot create a session: $out"; return 1; }
  session=${out##* }
  [[ $session =~ ^[0-9]+$ ]] || { say "unexpected answer to -g: $out"; return 1; }
}

session=0
state_dir_ok || { say "training goes on without the cache"; exit 0; }
if start; then
  say "cache server on port $port, session $session"
else
  say "training goes on without the cache"
  admin --stop >/dev/null 2>&1
  session=0
fi
write_env "$session" || say "cannot write $env_file"
exit 0
