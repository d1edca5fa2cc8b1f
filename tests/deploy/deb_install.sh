#!/usr/bin/env bash
# deb_install.sh BUILD_DIR SOURCE_DIR
#
# Packages the existing build with cpack (the DEB generator of CMakeLists.txt; nothing is
# rebuilt when the build is up to date), checks the package's control fields, installs it with
# dpkg into a scratch root (dpkg --root: its own package database, nothing touches the system),
# then starts the INSTALLED personaplex-server from there on the tiny model of tests/data and
# requires /health to answer and a clean exit on SIGTERM.
# Exit 77 (ctest SKIP_RETURN_CODE) only when dpkg or dpkg-deb is missing (not a Debian system).
set -uo pipefail
build=$1
src=$2
for tool in dpkg dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found"; exit 77; }
done
dir=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
  exit 1
}

# The package, written to the scratch folder (cpack's staging tree too, not the build tree).
cpack --config "$build/CPackConfig.cmake" -G DEB -B "$dir/pkg" >"$dir/cpack.log" 2>&1 ||
  fail "cpack failed"
deb=$(ls "$dir"/pkg/personaplex-server_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "cpack made no personaplex-server_*.deb"
echo "package: $(basename "$deb") ($(du -h "$deb" | cut -f1))"
dpkg-deb --field "$deb" Package Version Architecture Depends >"$dir/control.log" ||
  fail "dpkg-deb cannot read the package"
sed 's/^/  /' "$dir/control.log"
grep -q '^Package: personaplex-server$' "$dir/control.log" || fail "wrong package name"
grep -q '^Depends: .*libopus0' "$dir/control.log" || fail "Depends lacks the Opus library"
grep -qiE '^Depends: .*(cublas|cudart|cuda-)' "$dir/control.log" &&
  fail "Depends names a CUDA library package"

# Install into a scratch root with its own (empty) package database. Its dependencies are the
# host's libraries, which the empty database does not know: --force-depends.
root=$dir/root
mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info" "$root/var/log"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
  --log="$dir/dpkg_install.log" -i "$deb" >"$dir/dpkg.log" 2>&1 || fail "dpkg -i failed"
dpkg --root="$root" -s personaplex-server | grep -q '^Status: install ok installed' ||
  fail "dpkg does not list the package as installed"
for f in usr/bin/personaplex-server usr/bin/personaplex-load usr/bin/personaplex-offline \
  usr/share/personaplex/configs/personaplex-7b.json \
  usr/share/personaplex/deploy/nginx/personaplex.conf \
  usr/share/personaplex/deploy/kubernetes/personaplex.yaml \
  usr/share/personaplex/deploy/docker/Dockerfile \
  usr/lib/systemd/system/personaplex-server@.service; do
  [ -e "$root/$f" ] || fail "the package lacks /$f"
done
echo "installed into a scratch root: $(dpkg --root="$root" -L personaplex-server | grep -c /usr/bin/) tools"

# The installed server, on the tiny model of tests/data.
data=$src/tests/data
voices=$dir/voices
mkdir -p "$voices"
"$root/usr/bin/personaplex-server" --host 127.0.0.1 --port 0 \
  --config "$data/tiny_config_a.json" --lm "$data/lm_tiny_a.safetensors" \
  --mimi "$data/mimi_tiny_a.safetensors" --tokenizer "$data/tiny_spm_1000.model" \
  --voice-prompt-dir "$voices" >"$dir/server.log" 2>"$dir/server_err.log" &
pid=$!
port=""
for _ in $(seq 600); do
  port=$(sed -n 's|^listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$|\1|p' "$dir/server.log")
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || fail "the installed server exited early"
  sleep 0.1
done
[ -n "$port" ] || fail "the installed server printed no ready line"
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
resp=$(timeout 10 cat <&3)
exec 3<&-
grep -q '^HTTP/1.1 200' <<<"$resp" || fail "/health: $resp"
grep -q '"status":"ok"' <<<"$resp" || fail "/health: $resp"
echo "installed server /health: $(tail -n 1 <<<"$resp")"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
[ "$rc" -eq 0 ] || fail "the installed server exited with $rc on SIGTERM"
echo "deb install test passed"
