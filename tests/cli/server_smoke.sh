#!/usr/bin/env bash
# server_smoke.sh SERVER_BINARY: starts the server (embedded demo model) on a free port of
# 127.0.0.1, waits for its ready line (polling, bounded to 60 s), checks GET /health over a plain
# TCP socket, then stops it with SIGTERM and requires a clean exit.
set -uo pipefail
bin=$1
dir=$(mktemp -d)
"$bin" --host 127.0.0.1 --port 0 >"$dir/stdout" 2>"$dir/stderr" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
port=""
for _ in $(seq 600); do
  port=$(sed -n 's|^listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$|\1|p' "$dir/stdout")
  [ -n "$port" ] && break
  if ! kill -0 "$pid" 2>/dev/null; then echo "server exited early:"; cat "$dir/stderr"; exit 1; fi
  sleep 0.1
done
[ -n "$port" ] || { echo "no ready line"; cat "$dir/stderr"; exit 1; }
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' >&3
resp=$(timeout 10 cat <&3)
exec 3<&-
echo "$resp" | tail -n 1
grep -q '"status":"ok"' <<<"$resp" || { echo "bad /health answer"; exit 1; }
# The prompt cache is on by default (auto: 1 GiB on the CPU).
grep -q '"prompt_cache":{"capacity_bytes":1073741824,' <<<"$resp" || { echo "no default prompt cache in /health"; exit 1; }
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] || { echo "server exited with $rc"; cat "$dir/stderr"; exit 1; }
echo "server stopped cleanly"
