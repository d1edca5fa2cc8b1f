# Sourced by the scripts that run on the GPU machine (device_check.sh, device_ab.sh): unpacks the
# binaries that scripts/device_pack.sh built into /tmp/devrun and sets OUT, B (the binaries) and the
# library path. Run from the repository root.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/devrun
tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib:${LD_LIBRARY_PATH:-}
B=/tmp/devrun/bin

# lm_batch_runs DEFAULT_BATCHES: the ';'-separated "NAME:FLAGS[:BIN]" entries of LM_RUNS (default
# "fast:--fast"), each a `personaplex-bench --lm-batch` run (or BIN's: another build's bench packed
# into $B under its own name: device_pack.sh's PPX_DEV_BINS copies by file name, so copy it into the
# build folder renamed first, e.g. base/personaplex-bench-base) at LM_BATCH (default
# DEFAULT_BATCHES) after PREFILL steps (none by default), $frames timed and $warmup untimed steps, into
# $raw/lm_batch_NAME.{json,log}; uses the caller's raw, frames, warmup, note, late and summary.
lm_batch_runs() {
  local e name flags bin
  IFS=';' read -r -a lm_runs <<<"${LM_RUNS-fast:--fast}"
  for e in "${lm_runs[@]}"; do
    [ -n "$e" ] || continue
    IFS=':' read -r name flags bin <<<"$e"
    late && { note "lm_batch $name skipped (time budget)"; continue; }
    # shellcheck disable=SC2086
    timeout 300 "$B/${bin:-personaplex-bench}" --device cuda --random-weights $flags --lm-batch ${LM_BATCH:-$1} \
      ${PREFILL:+--prefill "$PREFILL"} --frames "$frames" --warmup "$warmup" --out "$raw/lm_batch_$name.json" \
      >"$raw/lm_batch_$name.log" 2>&1
    note "lm_batch $name rc=$?"
  done
}
# The test binaries bake this machine's source paths in: point them at this checkout.
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs PPX_SERVER_BIN=$B/personaplex-server
