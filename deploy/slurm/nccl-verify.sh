#!/bin/sh
# The guide's fabric verification as a Slurm job: one short NCCL all-reduce across the allocation's nodes, its output
# written on every node to the directory the mfu-exporter daemon reads (sources.nccl.tests_paths), where
# mfu_nccl_test_passed and the alert MfuNcclTestFailed pick it up (docs/commands.md "Verifying the fabric").
#
#   sbatch -N 2 --ntasks-per-node=8 --gpus-per-node=8 --exclusive deploy/slurm/nccl-verify.sh
#
# Run it after a node is (re)provisioned, from a health-check reservation, or as the first step of a large job. The
# test binary is nccl-tests' all_reduce_perf built with MPI=1 (NCCL_TESTS, default: on the PATH); srun --mpi sets up
# the ranks. NCCL_DEBUG=INFO makes NCCL print the transport of every channel, so the verdict includes a fallback to
# sockets. Each node's file is written to a temporary name and renamed, so the daemon never reads half a file.
#SBATCH --job-name=nccl-verify
#SBATCH --time=00:10:00
set -eu
dir="${MFU_NCCL_DIR:-/var/lib/mfu-exporter/nccl}"
test_binary="${NCCL_TESTS:-all_reduce_perf}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET srun --mpi="${MFU_SRUN_MPI:-pmix}" \
  "$test_binary" -b 8M -e 1G -f 2 -g 1 > "$out" 2>&1 || true  # a failed run is a failed verification, kept too
# --input=all gives the output to one task on each node, which stores it there.
srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" --input=all sh -c '
  mkdir -p "$1" && tmp="$1/.nccl-$2.tmp" && cat > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$1/nccl-$2.txt"
  ls -1t "$1"/nccl-*.txt | tail -n +6 | xargs -r rm -f  # keep the five newest
' sh "$dir" "$SLURM_JOB_ID" < "$out"
# The verdict here as well, from this node's fabric: exit 1 fails the job when the test failed.
mfu-exporter nccl "$out"
