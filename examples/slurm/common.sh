# shellcheck shell=bash disable=SC2034,SC2154  # sourced: the scripts use and set these
# Shared by prolog.sh and epilog.sh (sourced). Per-job state of the node's
# shmcache server lives in $state_dir:
#   job<ID>/       run dir (socket, lock, log) of the job's server, 0700, the job user's
#   job<ID>.env    what task_prolog.sh exports to the job's tasks
# Settings (slurmd's environment, or edit here):
#   SHMCACHE_SLURM_STATE      state dir (default /run/shmcache-slurm)
#   SHMCACHE_SLURM_PORT_BASE  the job's instance is BASE + job id % 20000 (default 40000)
#   SHMCACHE_SLURM_START_ARGS more --start options, e.g. "--memory_cap_mb 65536 -s /local/spill"
#   SHMCACHE_BIN              directory of shmcache (default: found on PATH, else /usr/local/bin)

: "${SLURM_JOB_ID:?is not set: run by Slurm as Prolog/Epilog}"
: "${SLURM_JOB_UID:?is not set: run by Slurm as Prolog/Epilog}"
state_dir=${SHMCACHE_SLURM_STATE:-/run/shmcache-slurm}
job_dir=$state_dir/job$SLURM_JOB_ID
env_file=$state_dir/job$SLURM_JOB_ID.env
bin=${SHMCACHE_BIN:-$(dirname "$(command -v shmcache || echo /usr/local/bin/shmcache)")}

say() { echo "shmcache-slurm: job $SLURM_JOB_ID: $*" >&2; }

# Runs a command as the job's user: the server talks to its own user only.
as_user() {
  if [ "$(id -u)" = "$SLURM_JOB_UID" ]; then
    "$@"
  else
    setpriv --reuid="$SLURM_JOB_UID" --regid="${SLURM_JOB_GID:-$SLURM_JOB_UID}" \
      --init-groups -- "$@"
  fi
}

# shmcache ARGS...: the admin as the job's user, on the job's instance.
admin() {
  as_user env SHMCACHE_RUN_DIR="$job_dir" "$bin/shmcache" -p "$port" "$@"
}
