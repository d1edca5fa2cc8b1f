#!/usr/bin/env bash
# Capacity of the real server on the GPU machine (issue 13: --fast holds 20 real-time 30-second
# conversations with per-frame added latency p99 <= 80 ms): starts personaplex-server on a free
# loopback port with full-size random weights (and the synthetic 32000-piece tokenizer), waits
# for /health, then runs personaplex-load at each session count, one after the other, and stops
# the server. Optionally the same without the speed flags (stock) at a few counts.
#
# Needs the pack of scripts/device_pack.sh with personaplex-server and personaplex-load in it
# (carry devpkg). Output in $OUT: load_<mode>_n<N>.json and .log per run, server_<mode>.log,
# load_summary.json (every run's JSON under "runs"), summary.txt.
#
# Environment (defaults in brackets):
#   SESSIONS ["1 12 16 20 24"]   session counts of the --fast runs
#   DURATION [30]                seconds of audio per session
#   RAMP_MS [100]                session i connects i * RAMP_MS after the first
#   FAST_FLAGS ["--fast"]        the speed flags of the main runs
#   STOCK [0]                    1: also run the server without speed flags ...
#   STOCK_SESSIONS ["12 16"]     ... at these counts
#   CONFIG [configs/personaplex-7b.json], DEVICE [cuda], SERVER_FLAGS [""] (added to the server)
#   LOAD_FLAGS [""]              added to personaplex-load (split on spaces)
#   TEXT_PROMPT_FILE [""]        every session's text prompt: this file's text (e.g.
#                                bench/prompts/long_prompt.txt, 1413 prompt steps)
#   CHURN_PROMPT_FILE [""]       the churn sessions' text prompt (with LOAD_FLAGS=--churn R; add
#                                --churn-unique-prompts there to keep them out of the prompt cache)
#   VOICE_SECONDS [""]           every session's voice prompt: a synthetic speech-like WAV of this
#                                many seconds (24 kHz) in a voice folder made for the server; 232
#                                fills ~2900 of the 3000 frames of context (issue #14's full-context
#                                real-server run), the first session replays it, the rest load it
#                                from the prompt cache
#   TIME_BUDGET_S [510]          a run that would end past this many seconds is skipped
#   MAX_SESSIONS_EXTRA [0]       server slots beyond the largest count (room for LOAD_FLAGS=--churn)
#   PPX_BIN_DIR                  take the binaries from this folder instead of unpacking devpkg
#                                (local test: PPX_BIN_DIR=build/src CONFIG=... DEVICE=cpu)
set -u
cd "$(dirname "$0")/.." || exit 1
if [ -n "${PPX_BIN_DIR:-}" ]; then
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  B=$PPX_BIN_DIR
else
  . scripts/device_common.sh
fi
sessions=${SESSIONS:-"1 12 16 20 24"}
duration=${DURATION:-30}
ramp_ms=${RAMP_MS:-100}
fast_flags=${FAST_FLAGS-"--fast"}
stock=${STOCK:-0}
stock_sessions=${STOCK_SESSIONS:-"12 16"}
config=${CONFIG:-configs/personaplex-7b.json}
device=${DEVICE:-cuda}
budget=${TIME_BUDGET_S:-510}
t_begin=$(date +%s)
summary=$OUT/summary.txt
: >"$summary"
runs=()  # "mode_nN" of every JSON written
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm \
  --format=csv >"$OUT/gpu.txt" 2>&1

voice_args=()
load_voice=()
if [ -n "${VOICE_SECONDS:-}" ]; then
  voice_dir=$(mktemp -d)
  python3 - "$voice_dir/long.wav" "$VOICE_SECONDS" <<'PY'
import array, math, sys, wave
path, seconds, sr = sys.argv[1], float(sys.argv[2]), 24000
n = int(seconds * sr)
out = array.array("h", bytes(2 * n))
phase = 0.0
for i in range(n):
    t = i / sr
    f0 = 120.0 + 30.0 * math.sin(2 * math.pi * 0.3 * t)  # gliding pitch
    phase += 2 * math.pi * f0 / sr
    env = max(0.0, math.sin(2 * math.pi * 2.5 * t)) * (0.0 if (t % 4.0) > 3.4 else 1.0)  # syllables, pauses
    v = env * (0.5 * math.sin(phase) + 0.25 * math.sin(2 * phase) + 0.12 * math.sin(3 * phase))
    out[i] = int(8000 * v)
with wave.open(path, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(sr)
    w.writeframes(out.tobytes())
PY
  voice_args=(--voice-prompt-dir "$voice_dir")
  load_voice=(--voice long.wav)
  echo "voice prompt: ${VOICE_SECONDS} s synthetic WAV ($(du -k "$voice_dir/long.wav" | cut -f1) KiB)" >>"$summary"
fi

server_pid=""
port=""
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$server_pid" 2>/dev/null
  wait "$server_pid" 2>/dev/null
  server_pid=""
}
trap stop_server EXIT

# GET /health over bash's /dev/tcp (no curl on the GPU machine); prints the body.
health() {
  { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 1
  printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' >&3
  timeout 5 cat <&3 | tail -n 1
  exec 3<&-
}

# start_server MODE MAX_SESSIONS FLAGS...: sets server_pid and port; returns 1 on failure.
start_server() {
  local mode=$1 max=$2
  shift 2
  local log=$OUT/server_$mode.log
  # shellcheck disable=SC2086
  "$B/personaplex-server" --config "$config" --random-weights --device "$device" "$@" "${voice_args[@]}" \
    ${SERVER_FLAGS:-} --host 127.0.0.1 --port 0 --max-sessions "$max" --idle-timeout 30 \
    --drain-timeout 2 >"$log" 2>&1 &
  server_pid=$!
  port=""
  for _ in $(seq 3000); do  # the 7B model loads in well under 5 minutes
    port=$(sed -n 's|^listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$|\1|p' "$log")
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "server $mode did not start:" >>"$summary"
    tail -n 20 "$log" >>"$summary"
    stop_server
    return 1
  fi
  for _ in $(seq 100); do
    health | grep -q '"status":"ok"' && break
    sleep 0.1
  done
  echo "server $mode on port $port: $(health)" >>"$summary"
}

# Polls /health until no session is in use (at most 15 s).
wait_idle() {
  for _ in $(seq 150); do
    health | grep -q '"sessions_in_use":0' && return 0
    sleep 0.1
  done
  echo "warning: sessions still in use on the server" >>"$summary"
}

# run_load MODE N: one personaplex-load run against the running server.
run_load() {
  local mode=$1 n=$2 name="$1_n$2"
  local now end
  now=$(date +%s)
  end=$((now - t_begin + duration + 20 + n * ramp_ms / 1000))
  if [ "$end" -gt "$budget" ]; then
    echo "load $name skipped: would end at ${end} s, past TIME_BUDGET_S=$budget" >>"$summary"
    return
  fi
  wait_idle
  local prompt=()
  [ -n "${TEXT_PROMPT_FILE:-}" ] && prompt=(--text-prompt "$(cat "$TEXT_PROMPT_FILE")")
  [ -n "${CHURN_PROMPT_FILE:-}" ] && prompt+=(--churn-text-prompt "$(cat "$CHURN_PROMPT_FILE")")
  # shellcheck disable=SC2086
  "$B/personaplex-load" --port "$port" --sessions "$n" --duration "$duration" \
    --ramp-ms "$ramp_ms" --quiet --json "$OUT/load_$name.json" "${prompt[@]}" "${load_voice[@]}" ${LOAD_FLAGS:-} \
    >"$OUT/load_$name.log" 2>&1
  local rc=$?
  echo "load $name rc=$rc: $(grep -E '^ +all ' "$OUT/load_$name.log")" >>"$summary"
  grep -E '^(handshake|churn)' "$OUT/load_$name.log" | sed 's/^/    /' >>"$summary"
  [ -s "$OUT/load_$name.json" ] && runs+=("$name")
}

max_of() { printf '%s\n' "$@" | sort -n | tail -n 1; }

# shellcheck disable=SC2086
if start_server fast "$(( $(max_of $sessions) + ${MAX_SESSIONS_EXTRA:-0} ))" $fast_flags; then
  for n in $sessions; do run_load fast "$n"; done
  stop_server
fi
if [ "$stock" = 1 ]; then
  # shellcheck disable=SC2086
  if start_server stock "$(max_of $stock_sessions)"; then
    for n in $stock_sessions; do run_load stock "$n"; done
    stop_server
  fi
fi

# Every run's JSON in one file (concatenated, so no JSON tool is needed here).
{
  printf '{"config":"%s","device":"%s","fast_flags":"%s","duration_s":%s,"ramp_ms":%s,"runs":{' \
    "$config" "$device" "$fast_flags" "$duration" "$ramp_ms"
  sep=""
  for name in "${runs[@]}"; do
    printf '%s"%s":' "$sep" "$name"
    cat "$OUT/load_$name.json"
    sep=","
  done
  printf '}}\n'
} >"$OUT/load_summary.json"
echo "wall time $(($(date +%s) - t_begin)) s" >>"$summary"
cat "$summary"
