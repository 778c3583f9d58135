#!/bin/bash
# Slurm TaskProlog (runs as the job's user before each task): exports what
# prolog.sh wrote for this job (SHMCACHE_PORT, SHMCACHE_RUN_DIR, SESSION_ID,
# SHMCACHE_SESSION_ID). Slurm reads "export NAME=value" lines from its
# standard output. Without the file (the prolog refused its state dir),
# the tasks get session 0: the cache warns once and reads from the source.
env_file=${SHMCACHE_SLURM_STATE:-/run/shmcache-slurm}/job${SLURM_JOB_ID:-}.env
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
if [ ! -f "$env_file" ] || [ -L "$env_file" ] || [ ! -r "$env_file" ]; then
  echo "export SESSION_ID=0"
  echo "export SHMCACHE_SESSION_ID=0"
  exit 0
fi
while IFS='=' read -r name value; do
  [[ $name =~ ^[A-Z_]+$ ]] && echo "export $name=$value"
done < <(timeout 5 cat -- "$env_file")
exit 0
