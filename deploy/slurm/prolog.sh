#!/bin/sh
# Slurm Prolog: tells GPU exporters which job holds which GPU on this node, in the per-GPU job mapping directory
# the standard GPU exporter reads (dcgm-exporter --hpc-job-mapping-dir; mfu-exporter discovery.slurm.job_mapping_dir):
# one file per GPU index, named by the index, holding the job ID. epilog.sh removes them.
#
# slurm.conf:  Prolog=/etc/slurm/prolog.d/mfu-job-mapping.sh   Epilog=/etc/slurm/epilog.d/mfu-job-mapping.sh
#              PrologFlags=Alloc   (so the files exist from allocation, before the first step or in an idle salloc)
# slurmd runs it as root with the job's SLURM_* environment. SLURM_JOB_GPUS holds the job's GPUs on this node as
# Slurm's global GPU IDs (srun(1): "not relative to any device cgroup"), i.e. their order in gres.conf: with
# AutoDetect=nvml that is NVML's index, the one both exporters key by; with File= lines, list the devices in NVML's
# (PCI bus) order, since /dev/nvidiaN minor numbers need not follow it.
#
# A GPU is the job's alone (GRES GPUs are not shared between jobs), so each file is replaced whole: an ID left by a
# job whose epilog never ran (a node crash) is overwritten by the next job on that GPU. Written to a temporary
# name and renamed, so a reader never sees a half-written or empty file.
set -eu
dir="${MFU_JOB_MAPPING_DIR:-/run/gpu-job-mapping}"
job="${SLURM_JOB_ID:?not run by slurmd: SLURM_JOB_ID is not set}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "$gpus" ] || exit 0  # a job without GPUs on this node
mkdir -p "$dir"
chmod 0755 "$dir"
for id in $(echo "$gpus" | tr ',' ' '); do
  case "$id" in
    *[!0-9]*) echo "mfu-job-mapping prolog: GPU ID '$id' in SLURM_JOB_GPUS is not an index; skipped" >&2; continue ;;
  esac
  tmp="$dir/.$id.$job.tmp"
  printf '%s\n' "$job" > "$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$dir/$id"
done
exit 0
