#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (built in build-asan/ by scripts/sanitize.sh, with ASan and
# UBSan) for SECONDS each, at most $(nproc) at a time. Seeds come from tests/data and
# fuzz/corpus/<target>/; what a fuzzer adds goes to build-asan/fuzz/work/<target>/ (kept between
# local runs, never committed). A crash, sanitizer report, leak, timeout or out-of-memory input
# fails the script; the input is saved as build-asan/fuzz/artifacts/<target>-crash-*, and
# `build-asan/fuzz/<target> FILE` replays it.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (default 60 s, every target)
#   e.g. scripts/fuzz.sh 3600 fuzz_pt_reader   for a longer local run of one target.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_ogg_opus fuzz_pt_reader fuzz_safetensors fuzz_query)
fi
if [ "${PPX_FUZZ_NO_BUILD:-0}" != 1 ]; then
  scripts/sanitize.sh --build-only
fi

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0

work=build-asan/fuzz/work
artifacts=build-asan/fuzz/artifacts
mkdir -p "$artifacts"

# Seed files of a target (the committed ones come as a read-only corpus directory).
seeds() {
  case "$1" in
    fuzz_pt_reader) ls tests/data/*.pt ;;
    fuzz_safetensors) ls tests/data/voice_tiny_a_cuda_contents.safetensors ;;  # the small one
  esac
}
# The committed seed folder of a target, fuzz/corpus/<name>.
corpus_dir() {
  case "$1" in
    fuzz_ogg_opus) echo fuzz/corpus/ogg ;;  # from fuzz/make_ogg_seed.cpp
    fuzz_query) echo fuzz/corpus/query ;;
    *) echo "fuzz/corpus/${1#fuzz_}" ;;
  esac
}
# Largest input per target: a few Ogg pages; the small .pt and safetensors files.
max_len() {
  case "$1" in
    fuzz_ogg_opus) echo 16384 ;;
    fuzz_query) echo 4096 ;;
    *) echo 8192 ;;
  esac
}

run_one() {
  local t=$1 log=$work/$1.log
  mkdir -p "$work/$t"
  for f in $(seeds "$t"); do cp -n "$f" "$work/$t/" 2>/dev/null || true; done
  local corpora=("$work/$t")
  if [ -d "$(corpus_dir "$t")" ]; then corpora+=("$(corpus_dir "$t")"); fi
  "build-asan/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
    -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
    "${corpora[@]}" >"$log" 2>&1
}

status=0
pids=()
names=()
report() {  # $1: index into pids/names
  local t=${names[$1]} rc=0
  wait "${pids[$1]}" || rc=$?
  local execs speed
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz: $t FAILED (exit $rc); log: $work/$t.log"
    tail -n 60 "$work/$t.log"
  else
    echo "fuzz: $t ok: ${execs:-?} runs, ${speed:-?} exec/s, corpus $(ls "$work/$t" | wc -l) files"
  fi
}
jobs_max=$(nproc)
for t in "${targets[@]}"; do
  [ -x "build-asan/fuzz/$t" ] || { echo "fuzz: build-asan/fuzz/$t is not built" >&2; exit 1; }
  echo "fuzz: $t for $seconds s"
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge "$jobs_max" ]; then
    report 0
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
while [ ${#pids[@]} -gt 0 ]; do
  report 0
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
done
exit $status
