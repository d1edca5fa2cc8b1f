#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need. Idempotent: does nothing when all
# are present. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev
  libopus-dev libogg-dev libsndfile1-dev libsoxr-dev libebur128-dev
  libsentencepiece-dev sentencepiece
  libssl-dev openssl
  chromium  # the browser test of the web client (headless)
  clang libclang-rt-dev  # scripts/sanitize.sh, scripts/fuzz.sh: ASan/UBSan/libFuzzer runtimes
  nginx  # tests/deploy: the shipped nginx configuration in front of two servers (started by the test)
  dpkg-dev  # tests/deploy: cpack's DEB generator (dpkg-shlibdeps) and the .deb install test
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Packages that ship a service (nginx) must not start it: the tests start their own nginx on
# loopback ports, and a system nginx left running would hold port 80 for nothing. Debian's
# policy-rc.d hook (exit 101: action forbidden) keeps the install from starting it; an existing
# hook is left alone.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  "${sudo_cmd[@]}" sh -c "printf '#!/bin/sh\\nexit 101\\n' > $policy && chmod 755 $policy"
  trap '"${sudo_cmd[@]}" rm -f "$policy"' EXIT
fi
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
