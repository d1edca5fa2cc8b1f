#!/usr/bin/env bash
# nginx_balance.sh SERVER_BIN LOAD_BIN SOURCE_DIR
#
# Two personaplex-server processes with one slot each (embedded tiny demo model, CPU) behind
# Debian's nginx, run with the SHIPPED configuration: deploy/nginx/personaplex.conf as it is,
# except its `listen` and `access_log` lines (a loopback port and this test's folder), and the
# shipped upstream example deploy/nginx/personaplex-upstreams.conf with the two servers' ports.
# nginx runs in the foreground from a temporary folder, not as a system service.
#
# Checks, all through nginx: two clients land on different servers and both converse (audio
# frames back, personaplex-load passes); a third client gets HTTP 503 with Retry-After and the
# JSON busy error (both upstreams refused the upgrade); when one client leaves, a new one gets
# in; with one server taken by a client that bypasses nginx, new clients still get in because
# nginx retries the 503 on the other server (proxy_next_upstream http_503, seen in the access log
# as "503, 101"); the api_key never reaches the access log.
# Exit 77 (ctest SKIP_RETURN_CODE) only when nginx is not installed.
set -uo pipefail
server_bin=$1
load_bin=$2
src=$3
nginx_bin=$(command -v nginx || true)
[ -z "$nginx_bin" ] && [ -x /usr/sbin/nginx ] && nginx_bin=/usr/sbin/nginx
if [ -z "$nginx_bin" ]; then
  echo "SKIP: nginx is not installed (scripts/setup.sh installs it)"
  exit 77
fi

dir=$(mktemp -d)
chmod 755 "$dir"  # nginx's workers drop to an unprivileged user when the test runs as root
key=test-secret-key-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log "$dir"/*.err; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
  done
  exit 1
}
# wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s until it succeeds.
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -ge "$end" ] && return 1
    sleep 0.1
  done
}
# http PORT TARGET [EXTRA-HEADERS]: one HTTP/1.1 GET, the whole answer printed. EXTRA-HEADERS
# are written with \r\n escapes, each header ending in one.
http() {
  local out
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  # The extra headers are part of the format, so that their \r\n escapes are expanded.
  printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n${3:-}\r\n" "$2" >&3
  out=$(timeout 5 cat <&3)
  exec 3<&-
  printf '%s\n' "$out"
}
in_use() {  # the server's sessions_in_use, -1 when /health did not answer
  local v
  v=$(http "$1" /health | sed -n 's/.*"sessions_in_use":\([0-9]*\).*/\1/p')
  echo "${v:--1}"
}
is_in_use() { [ "$(in_use "$1")" = "$2" ]; }
# client NAME PORT DURATION [more personaplex-load flags]: one real-time session, in background.
client() {
  local name=$1 port=$2 duration=$3
  shift 3
  "$load_bin" --host 127.0.0.1 --port "$port" -n 1 --duration "$duration" --drain 3 \
    --api-key "$key" --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 &
  eval "${name}_pid=$!"
}
# passed NAME: the client's process exited 0 and got audio frames back.
passed() {
  local pid_var="${1}_pid" rc
  wait "${!pid_var}"
  rc=$?
  [ "$rc" -eq 0 ] || fail "client $1 exited with $rc"
  grep -Eq '"frames_received": [1-9]' "$dir/$1.json" || fail "client $1 received no audio"
  echo "client $1 conversed: $(grep -E -m1 '"frames_received"' "$dir/$1.json" | tr -d ' ,')"
}

# The two servers, one slot each.
for s in a b; do
  "$server_bin" --host 127.0.0.1 --port 0 --max-sessions 1 --drain-timeout 1 --api-key "$key" \
    >"$dir/server_$s.log" 2>"$dir/server_$s.err" &
  pids+=($!)
done
port_of() { sed -n 's|^listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$|\1|p' "$dir/server_$1.log"; }
has_port() { [ -n "$(port_of "$1")" ]; }
wait_for 60 has_port a || fail "server a did not start"
wait_for 60 has_port b || fail "server b did not start"
pa=$(port_of a)
pb=$(port_of b)
echo "servers on ports $pa and $pb"

# nginx with the shipped configuration. The listen and access_log lines are the only changes;
# each must match exactly once, so that a change to the shipped file cannot silently bypass them.
conf=$src/deploy/nginx/personaplex.conf
[ "$(grep -c '^    listen 80;$' "$conf")" = 1 ] || fail "no single 'listen 80;' line in $conf"
[ "$(grep -c '^    access_log /var/log/nginx/personaplex.access.log personaplex;$' "$conf")" = 1 ] ||
  fail "no single access_log line in $conf"
sed "s|127\.0\.0\.1:8998 |127.0.0.1:$pa |; s|127\.0\.0\.1:8999 |127.0.0.1:$pb |" \
  "$src/deploy/nginx/personaplex-upstreams.conf" >"$dir/personaplex-upstreams.conf"
[ "$(grep -c "^server 127.0.0.1:\($pa\|$pb\) max_fails=0;$" "$dir/personaplex-upstreams.conf")" = 2 ] ||
  fail "the shipped upstream example did not take the two ports"
mkdir -p "$dir/tmp"
nport=""
for _ in 1 2 3 4 5; do
  cand=$((20000 + RANDOM % 30000))
  (exec 3<>"/dev/tcp/127.0.0.1/$cand") 2>/dev/null && continue  # taken
  sed "s|^    listen 80;$|    listen 127.0.0.1:$cand;|; s|/var/log/nginx/personaplex.access.log|$dir/access.log|" \
    "$conf" >"$dir/personaplex.conf"
  cat >"$dir/nginx.conf" <<EOF
# Generated by tests/deploy/nginx_balance.sh around the shipped deploy/nginx/personaplex.conf.
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx_error.log info;
events { worker_connections 256; }
http {
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    include personaplex.conf;
}
EOF
  "$nginx_bin" -t -p "$dir" -c "$dir/nginx.conf" -e "$dir/nginx_error.log" >"$dir/nginx_t.log" 2>&1 ||
    fail "nginx -t rejected the shipped configuration: $(cat "$dir/nginx_t.log")"
  "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/nginx_error.log" >"$dir/nginx.log" 2>&1 &
  npid=$!
  if wait_for 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$cand" 2>/dev/null; then
    nport=$cand
    pids+=("$npid")
    break
  fi
  kill "$npid" 2>/dev/null
  wait "$npid" 2>/dev/null
done
[ -n "$nport" ] || fail "nginx did not start"
echo "nginx (shipped configuration) on port $nport"

ready=$(http "$nport" /health/ready)
grep -q '^HTTP/1.1 200' <<<"$ready" || fail "/health/ready through nginx: $ready"

# Two clients: one on each server.
client c1 "$nport" 7
one_in_use() { [ "$(($(in_use "$pa") + $(in_use "$pb")))" -eq 1 ]; }
wait_for 30 one_in_use || fail "the first client did not take a slot"
if is_in_use "$pa" 1; then first=$pa other=$pb; else first=$pb other=$pa; fi
client c2 "$nport" 12
wait_for 30 is_in_use "$other" 1 || fail "the second client did not land on the other server"
is_in_use "$first" 1 || fail "the first server lost its session"
echo "two clients through nginx: one on :$first, one on :$other"

# A third: both servers refuse the upgrade with 503, and nginx hands that answer on.
busy=$(http "$nport" "/api/chat?api_key=$key" \
  'Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n')
grep -q '^HTTP/1.1 503' <<<"$busy" || fail "third client: expected HTTP 503, got: $busy"
grep -qi '^Retry-After: 1' <<<"$busy" || fail "third client: no Retry-After: $busy"
grep -q '"code":"busy"' <<<"$busy" || fail "third client: no busy error: $busy"
echo "third client: $(head -n 1 <<<"$busy" | tr -d '\r'), $(grep -o '"message":"[^"]*"' <<<"$busy")"
client c3 "$nport" 1
wait "$c3_pid" && fail "the third personaplex-load session passed on a full fleet"
echo "third personaplex-load session: $(grep -o '"failure": "[^"]*"' "$dir/c3.json")"

# The first leaves; a new client gets its slot.
passed c1
wait_for 15 is_in_use "$first" 0 || fail "the first server did not free its slot"
client c4 "$nport" 2
wait_for 30 is_in_use "$first" 1 || fail "the new client did not get the freed slot"
passed c4
passed c2
wait_for 15 is_in_use "$other" 0 || fail "the second server did not free its slot"

# One server full behind nginx's back (a direct client): nginx's connection counts tie, so it
# alternates between the two servers for each request, personaplex-load's own GET /health
# included. A client whose upgrade is sent to the full server first must still get in, its 503
# retried on the other one. One extra request between clients shifts the alternation, so one of
# the first two clients meets the full server (at most three are tried).
retried() { grep -q 'GET /api/chat HTTP/1.1" 101 .*upstream_status=503, 101$' "$dir/access.log"; }
client d1 "$pa" 8
wait_for 30 is_in_use "$pa" 1 || fail "the direct client did not take server a"
for n in n1 n2 n3; do
  client "$n" "$nport" 1
  passed "$n"
  wait_for 15 is_in_use "$pb" 0 || fail "server b did not free its slot"
  wait_for 1 retried && break
  http "$nport" /health/live >/dev/null
done
passed d1

# The access log: one line per conversation, the retried one included, no api_key anywhere.
retried || fail "no conversation retried on the next server after a 503 (proxy_next_upstream)"
grep -q 'GET /api/chat HTTP/1.1" 503 .*upstream_status=503, 503$' "$dir/access.log" ||
  fail "the busy client's line does not show both servers refusing"
grep -q "$key" "$dir/access.log" && fail "the api_key reached the access log"
echo "access log (api_key absent):"
sed 's/^/  /' "$dir/access.log"
if grep -q "$key" "$dir/nginx_error.log"; then
  echo "note: nginx's error log holds the request line with the api_key (docs/deploy.md)"
fi
echo "nginx balancing test passed"
