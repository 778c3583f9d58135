#!/bin/bash
# Slurm TaskProlog (runs as the job's user before each task): exports what
# prolog.sh wrote for this job (SHMCACHE_PORT, SHMCACHE_RUN_DIR, SESSION_ID).
# Slurm reads "export NAME=value" lines from its standard output.
env_file=${SHMCACHE_SLURM_STATE:-/run/shmcache-slurm}/job${SLURM_JOB_ID:-}.env
[ -n "${SLURM_JOB_ID:-}" ] && [ -r "$env_file" ] || exit 0
while IFS='=' read -r name value; do
  [[ $name =~ ^[A-Z_]+$ ]] && echo "export $name=$value"
done <"$env_file"
exit 0
