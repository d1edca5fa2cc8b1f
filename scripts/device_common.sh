# Sourced by the scripts that run on the GPU machine (device_check.sh, device_ab.sh): unpacks the
# binaries that scripts/device_pack.sh built into /tmp/devrun and sets OUT, B (the binaries) and the
# library path. Run from the repository root.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/devrun
tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib:${LD_LIBRARY_PATH:-}
B=/tmp/devrun/bin
# The test binaries bake this machine's source paths in: point them at this checkout.
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs PPX_SERVER_BIN=$B/personaplex-server
