#!/bin/sh
# Slurm Epilog: removes what prolog.sh wrote for this job (see there). A GPU's file is removed only while it still
# holds this job's ID, so an epilog that runs late never deletes the next job's file. Slurm releases a node's GPUs
# only after the epilog ends, so no prolog writes a file this job still holds.
set -eu
dir="${MFU_JOB_MAPPING_DIR:-/run/gpu-job-mapping}"
job="${SLURM_JOB_ID:?not run by slurmd: SLURM_JOB_ID is not set}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "$gpus" ] && [ -d "$dir" ] || exit 0
for id in $(echo "$gpus" | tr ',' ' '); do
  case "$id" in *[!0-9]*) continue ;; esac
  file="$dir/$id"
  if [ -f "$file" ] && [ "$(cat "$file")" = "$job" ]; then
    rm -f "$file"
  fi
done
exit 0
