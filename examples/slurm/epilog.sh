#!/bin/bash
# Slurm Epilog (runs as root on every node of the job after it ends): drops
# the job's session and stops this node's server as the job's user, which
# removes its shared memory, then removes the job's state. A server that
# does not answer is terminated and its shared-memory files removed.
# Always exits 0 (a failing Epilog drains the node); problems go to stderr
# (slurmd's log).
#
# Run as root, it acts only on what root wrote (the env file in the state
# dir) and on processes of the job's user: it never reads a file of the
# job's run dir (the job's user can write there), never follows a link,
# never enters a file system mounted in the job's run dir or shm dir (the
# job's user may have put one there: a FUSE server of theirs could hang a
# step, a bind mount lead rm to files elsewhere), and every step that
# waits is bounded in time.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=examples/slurm/common.sh
source "$here/common.sh"
state_dir_ok || exit 0
port=$(read_env SHMCACHE_PORT)
session=$(read_env SESSION_ID)
shm_dir=$(read_env SHMCACHE_SHM_DIR)
[[ $port =~ ^[0-9]+$ ]] || { [ -e "$env_file" ] && say "no port in $env_file"; rm -f "$env_file"; exit 0; }
[[ $session =~ ^[0-9]+$ ]] || session=0

# The job's servers on its port: processes of the job's user named
# shmcached whose command line names the port (the admin starts it so), a
# line "PID START" each (start_of, read before the command line: a pid
# given again after this look is another start). Whatever a process of
# the job's user says of itself, only that user's processes are ever
# signalled, and only the very processes listed (signal_server). The
# command line is read under a timeout: its pages are the user's, and a
# page the user backs by a file system they serve could stall the read.
servers() {
  local pid start
  for pid in $(pgrep -x -U "$SLURM_JOB_UID" shmcached); do
    start=$(start_of "$pid") &&
      timeout -k 1 5 tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qx -- "--port=$port" &&
      echo "$pid $start"
  done
}

if [ -n "$(servers)" ]; then
  if [ "$session" != 0 ]; then
    out=$(admin -d "$session" 2>&1) ||
      say "cannot drop session $session: $out"
  fi
  out=$(admin --stop 2>&1)
  if [ -n "$(servers)" ]; then
    say "the server did not stop (${out:-no answer}); terminating it"
    # Signalled as the job's user, and only the process listed: should a
    # listed server end and its pid go to another process before the
    # signal, it is not sent (signal_server).
    for sig in TERM KILL; do
      while read -r pid start; do
        signal_server "$pid" "$start" "$sig" </dev/null  # the loop reads the list
      done < <(servers)
      for _ in $(seq 100); do [ -z "$(servers)" ] && break; sleep 0.1; done
    done
  fi
fi
# A server that died or was killed leaves its segments: they are this job's
# user's, removed as that user. Started as root without a shm dir, it kept
# them in a huge-page tmpfs of its own, left mounted: unmount it (never
# through a link). Only a root job's server can have mounted one: for any
# other job nothing is unmounted, since the path is in /dev/shm, where the
# job's user could swap it for a link to another mount between the checks
# and umount (which follows links), and the shm dir in the env file is what
# the user's server said. Nor for a root job is a directory another user
# put at that name (after a clean stop removed root's): it must be root's,
# seen by one lstat (stat without -L), since no one else can rename or
# replace an entry of root's in sticky /dev/shm once it is there.
if [ -z "$(servers)" ]; then
  as_user timeout -k 5 30 find -P "${shm_dir:-/dev/shm}" /dev/shm -maxdepth 1 -xdev \
    \( -name "shmcache.$SLURM_JOB_UID.$port.*" -o -name ".shmcache.$SLURM_JOB_UID.$port.lock" \) \
    ! -type d -delete 2>/dev/null
  huge=/dev/shm/shmcache.$SLURM_JOB_UID.$port.huge
  if [ "$SLURM_JOB_UID" = 0 ] && [ "$shm_dir" = "$huge" ] &&
     [ "$(timeout -k 5 10 stat -c %u:%F -- "$huge" 2>/dev/null)" = 0:directory ]; then
    if timeout -k 5 10 mountpoint -q "$huge"; then
      timeout -k 5 30 umount "$huge" 2>/dev/null || umount -l "$huge" ||
        say "cannot unmount $huge"
    fi
    rmdir "$huge" 2>/dev/null
  fi
fi
remove_job_dir
rm -f -- "$env_file"
exit 0
