#!/usr/bin/env bash
# Runs one GoogleTest binary as SHARDS processes at once (GoogleTest's own sharding:
# GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX, every test in exactly one shard), so the slow CI stages
# (the suites under ASan and under qemu) use both of CI's cores; ctest already runs the plain suites
# two at a time, so the tests see the same load. Each shard's output goes to LOGDIR/shardI.log;
# the script prints each shard's summary, the whole log of a shard that failed, and fails if any
# shard did (after all have ended).
#
# Usage: scripts/gtest_shards.sh SHARDS LOGDIR COMMAND [ARGS...]
#   COMMAND is the test binary with its flags, possibly behind a runner (qemu-aarch64 -L / BIN ...).
set -uo pipefail

if [ $# -lt 3 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 SHARDS LOGDIR COMMAND [ARGS...]" >&2
  exit 2
fi
shards=$1
logdir=$2
shift 2
mkdir -p "$logdir" || exit 2

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; exit 143' INT TERM  # no shard outlives the script
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$@" >"$logdir/shard$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < shards; ++i)); do
  if wait "${pids[$i]}"; then
    grep -E '^\[(==========|  PASSED  )\]' "$logdir/shard$i.log" | sed "s/^/shard $i of $shards: /"
  else
    rc=1
    echo "shard $i of $shards FAILED; its log ($logdir/shard$i.log):"
    cat "$logdir/shard$i.log"
  fi
done
exit $rc
