#!/usr/bin/env bash
# Runs a command with one busy process per core beside it, as on a CI machine shared with other work: a test that
# passes only on an idle machine fails here. BUSY_PROCESSES overrides the count.
set -u
count="${BUSY_PROCESSES:-$(nproc)}"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT INT TERM
for _ in $(seq "$count"); do
    ( while :; do :; done ) &
    pids+=("$!")
done
"$@"
