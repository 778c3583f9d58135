# shellcheck shell=bash disable=SC2034,SC2154  # sourced: the scripts use and set these
# Shared by prolog.sh and epilog.sh (sourced). Per-job state of the node's
# shmcache server lives in $state_dir:
#   job<ID>/       run dir (socket, lock, log) of the job's server, 0700, the job user's
#   job<ID>.env    what task_prolog.sh exports to the job's tasks (root's, 0644)
# The state dir must be the script user's (root's, under slurmd) and
# writable by nobody else (0700 or 0755), under directories nobody else
# may write unless sticky: the scripts create and remove files in it as
# root, and refuse to run on any other (a job user who could write there,
# or put their own directory in its place, could plant links for root to
# write through). Everything in
# job<ID>/ is the job user's to write: the scripts never read it as root.
# Settings (slurmd's environment, or edit here):
#   SHMCACHE_SLURM_STATE      state dir (default /run/shmcache-slurm)
#   SHMCACHE_SLURM_PORT_BASE  the job's instance is the first port from
#                             BASE + job id % 20000 (default base 40000) that no
#                             live job of the node holds (nor another user's
#                             lock file)
#   SHMCACHE_SLURM_START_ARGS more --start options, e.g. "--memory_cap_mb 65536 -s /local/spill"
#   SHMCACHE_BIN              directory of shmcache (default: found on PATH, else /usr/local/bin)

: "${SLURM_JOB_ID:?is not set: run by Slurm as Prolog/Epilog}"
: "${SLURM_JOB_UID:?is not set: run by Slurm as Prolog/Epilog}"
state_dir=${SHMCACHE_SLURM_STATE:-/run/shmcache-slurm}
job_dir=$state_dir/job$SLURM_JOB_ID
env_file=$state_dir/job$SLURM_JOB_ID.env
bin=${SHMCACHE_BIN:-$(dirname "$(command -v shmcache || echo /usr/local/bin/shmcache)")}

say() { echo "shmcache-slurm: job $SLURM_JOB_ID: $*" >&2; }

[[ $SLURM_JOB_ID =~ ^[0-9]+$ && $SLURM_JOB_UID =~ ^[0-9]+$ ]] ||
  { say "SLURM_JOB_ID and SLURM_JOB_UID must be numbers"; exit 0; }

# unsafe_dir_on_the_way DIR: prints the first directory from / to DIR
# (the links on the way as written, then the directories they lead to)
# that another user owns or may write without the sticky bit, where that
# user could swap a name below it for a link or a directory of their own;
# prints nothing and succeeds when there is none.
unsafe_dir_on_the_way() {
  local p=$1 owner mode me
  me=$(id -u)
  while [ "$p" != / ] && [ "$p" != . ]; do
    if [ -L "$p" ]; then
      owner=$(stat -c %u "$p")
      [ "$owner" = 0 ] || [ "$owner" = "$me" ] || { echo "$p"; return 1; }
    fi
    p=$(dirname "$p")
  done
  p=$(realpath -e -- "$1") || { echo "$1"; return 1; }
  while :; do
    owner=$(stat -c %u "$p") mode=$(stat -c %a "$p")
    if { [ "$owner" != 0 ] && [ "$owner" != "$me" ]; } ||
       (( (8#$mode & 8#022) && !(8#$mode & 8#1000) )); then
      echo "$p"
      return 1
    fi
    [ "$p" = / ] && return 0
    p=$(dirname "$p")
  done
}

# state_dir_ok: creates the state dir if missing (0755) and checks that it
# is a directory of the script's user that no one else can write, under
# directories no one else can swap it in; says what is wrong otherwise.
# Never follows a link.
state_dir_ok() {
  local bad
  if [[ $state_dir != /* ]]; then
    say "the state dir $state_dir is not an absolute path; set SHMCACHE_SLURM_STATE to one"
    return 1
  fi
  # Not created here (nor its parents): a missing one is a typo more often
  # than not, and the ancestry check below would call it another user's.
  if [ ! -d "$(dirname "$state_dir")" ]; then
    say "the state dir $state_dir cannot be made: $(dirname "$state_dir") does not exist; create it (root's, mode 0755), or set SHMCACHE_SLURM_STATE to a directory under one that exists (default /run/shmcache-slurm)"
    return 1
  fi
  if ! bad=$(unsafe_dir_on_the_way "$(dirname "$state_dir")"); then
    say "the state dir $state_dir is under $bad, which another user owns or may write (they could put a directory of their own in its place); put it under directories only $(id -un) may write (default /run/shmcache-slurm), or make $bad sticky (chmod +t)"
    return 1
  fi
  if [ ! -e "$state_dir" ] && [ ! -L "$state_dir" ]; then
    mkdir -m 0755 "$state_dir" 2>/dev/null ||
      { say "cannot create the state dir $state_dir"; return 1; }
  fi
  local owner mode
  if [ -L "$state_dir" ] || [ ! -d "$state_dir" ]; then
    say "the state dir $state_dir is not a directory (a link or a file is there); remove it, or set SHMCACHE_SLURM_STATE to a directory of $(id -un) with mode 0700 or 0755"
    return 1
  fi
  owner=$(stat -c %u "$state_dir") mode=$(stat -c %a "$state_dir")
  if [ "$owner" != "$(id -u)" ] || (( 8#$mode & 8#022 )); then
    say "the state dir $state_dir is owned by uid $owner with mode $mode; it must be $(id -un)'s with mode 0700 or 0755 (no one else may write in it): fix it with 'chown $(id -un) $state_dir && chmod 0755 $state_dir', or set SHMCACHE_SLURM_STATE"
    return 1
  fi
}

# read_env NAME: NAME's value in the job's env file, a regular file of the
# script's user (never a link or a FIFO), read in bounded time; the first
# line that sets it, should there be more.
read_env() {
  [ -f "$env_file" ] && [ ! -L "$env_file" ] &&
    [ "$(stat -c %u "$env_file")" = "$(id -u)" ] || return 1
  timeout 5 sed -n "s/^$1=//p" "$env_file" | head -n 1
}

# mounts_in DIR: the mount points at or below DIR, a line each (as
# /proc/self/mountinfo writes them: a space is \040). Read from the mount
# table, never by a stat: a FUSE server that does not answer hangs a stat
# of its mount point. DIR's parent must be root's (no link swapped in).
mounts_in() {
  local dir
  dir=$(realpath -e -- "$(dirname "$1")") || return 0
  awk -v d="$dir/$(basename "$1")" '
    BEGIN { gsub(/\\/, "\\134", d); gsub(/ /, "\\040", d)
            gsub(/\t/, "\\011", d); gsub(/\n/, "\\012", d) }
    $5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo
}

# remove_job_dir: removes job<ID>/ (the job user's to fill) in bounded
# time, and never what is mounted in it: the job's user may have put a
# file system there (FUSE, on any directory of theirs), whose server could
# hang rm, or which could hold files of elsewhere (a bind mount, of the
# same file system or another). With a mount in it, the directory is left
# and said; else rm (which never follows a link) stays on its file system
# (--one-file-system: should a FUSE mount come after the look), and is
# ended after 60 s.
remove_job_dir() {
  local out rc=0
  out=$(mounts_in "$job_dir")
  if [ -n "$out" ]; then
    say "left $job_dir: a file system is mounted in it (${out//$'\n'/, }); unmount it and remove the directory"
    return 1
  fi
  out=$(timeout -k 5 60 rm -rf --one-file-system -- "$job_dir" 2>&1) || rc=$?
  [ "$rc" = 0 ] && return 0
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && out="rm did not finish within 60 s"
  say "cannot remove $job_dir (${out//$'\n'/; }); a file system may be mounted in it: unmount it and remove the directory"
  return 1
}

# port_taken OUT: whether OUT, what 'shmcache --start' said when it failed,
# means that the port is taken (a server of this user holds it, or another
# user created its lock file), so that the next port may be tried; any other
# failure is the server's and ends the prolog's tries. The admin exits 1
# for either: the wording is common/instance_lock.cc's (TakeInstanceLock,
# TakeHostLock, NotOurs), pinned to the admin's actual output by
# tests/python/test_slurm_scripts.py.
port_taken() {
  [[ $1 == *"already running on port"* || $1 == *"another user created it"* ]]
}

# Runs a command as the job's user: the server talks to its own user only.
as_user() {
  if [ "$(id -u)" = "$SLURM_JOB_UID" ]; then
    "$@"
  else
    setpriv --reuid="$SLURM_JOB_UID" --regid="${SLURM_JOB_GID:-$SLURM_JOB_UID}" \
      --init-groups -- "$@"
  fi
}

# start_of PID: the start of process PID in clock ticks since boot (field
# 22 of /proc/PID/stat, counted after the last ')': the name before it is
# the process's to choose); fails when there is no such process.
start_of() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) && [[ $stat == *')'* ]] || return 1
  read -ra stat <<<"${stat##*)}"
  [[ ${stat[19]:-} =~ ^[0-9]+$ ]] && echo "${stat[19]}"
}

# Python's half of signal_server: holds the process by a pidfd before it
# reads its start, and signals through the pidfd. Exit 3: not the process
# listed (gone, or its pid given to another since).
pidfd_signal='
import os, signal, sys
pid, start, sig = int(sys.argv[1]), sys.argv[2], signal.Signals["SIG" + sys.argv[3]]
try:
    fd = os.pidfd_open(pid)
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
except (ProcessLookupError, FileNotFoundError):
    sys.exit(3)
if stat.rsplit(")", 1)[1].split()[19] != start:
    sys.exit(3)
try:
    signal.pidfd_send_signal(fd, sig)
except ProcessLookupError:
    sys.exit(3)
'

# signal_server PID START SIG: sends SIG, as the job's user, to process PID
# only while it is the process that started at START (start_of, read when
# it was listed): a pid that went to another process since, even one of
# the job's user, is never signalled. Through a pidfd (Python 3.9, Linux
# 5.3: the check and the signal are about one process); without one, by
# number just after the same check. Fails when nothing was sent.
signal_server() {
  local rc=0
  as_user timeout 10 python3 -I -c "$pidfd_signal" "$1" "$2" "$3" 2>/dev/null || rc=$?
  case $rc in
    0) return 0 ;;
    3) return 1 ;;
  esac
  [ "$(start_of "$1")" = "$2" ] && as_user kill -"$3" "$1" 2>/dev/null
}

# shmcache ARGS...: the admin as the job's user, on the job's instance,
# ended after 60 s (a server the job's user stopped answering must not
# hold up slurmd).
admin() {
  as_user timeout 60 env SHMCACHE_RUN_DIR="$job_dir" "$bin/shmcache" -p "$port" "$@"
}
