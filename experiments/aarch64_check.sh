#!/usr/bin/env bash
# Run the shared-memory tests on aarch64 (Kunpeng's ISA) under qemu user-mode emulation, on an x86-64
# Debian host with no binfmt_misc (so no chroot: every arm64 binary is started by qemu explicitly).
#
#   bash experiments/aarch64_check.sh [pytest args...]      (from the repository's root)
#
# What it does, each step skipped when already done:
# 1. apt: qemu-user-static and debootstrap (Debian's packages);
# 2. debootstrap --foreign --arch=arm64 --variant=minbase --include=python3 into $ARM64_ROOT (default
#    /work/arm64-root, outside any checkout). The first stage only unpacks the essential packages: the
#    second stage would run arm64 dpkg, which needs binfmt_misc, so every .deb it downloaded is
#    unpacked with dpkg-deb -x instead (enough for Python: nothing needs configuring);
# 3. the host's pip installs the Python dependencies as aarch64 cp311 wheels into $ARM64_ROOT/site
#    (pip's --platform/--target: no arm64 pip or compiler is run);
# 4. $ARM64_ROOT/python is a host script that runs the arm64 Python under `qemu-aarch64-static -L`;
#    a sitecustomize points sys.executable at it, so processes the tests spawn (multiprocessing's
#    spawn, subprocess) run under qemu too: without binfmt_misc the host kernel cannot exec an
#    arm64 ELF itself;
# 5. pytest on the shared-memory tests (those that need neither Ray nor MPI nor torch).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
ROOT=${ARM64_ROOT:-/work/arm64-root}
PY=$ROOT/usr/bin/python3.11

if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static debootstrap
fi

if [ ! -x "$PY" ]; then
    mkdir -p "$ROOT"
    debootstrap --foreign --arch=arm64 --variant=minbase --include=python3 bookworm "$ROOT" \
        http://deb.debian.org/debian
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$deb" "$ROOT"
    done
fi

if [ ! -d "$ROOT/site/numpy" ]; then
    # the host's pip, choosing aarch64 wheels for the arm64 root's CPython 3.11
    pip install --quiet --target "$ROOT/site" --platform manylinux2014_aarch64 --python-version 3.11 \
        --implementation cp --abi cp311 --only-binary=:all: \
        numpy networkx PyYAML ml_dtypes atomics cffi pytest pytest-timeout
fi

# qemu's -L serves a path from the root when it exists there: an empty $ROOT/dev/shm would hide the
# host's /dev/shm from directory listings (segments are opened on the host's, but not listed)
rm -rf "$ROOT/dev/shm"

cat > "$ROOT/python" <<EOF
#!/bin/sh
exec qemu-aarch64-static -L "$ROOT" "$PY" "\$@"
EOF
chmod +x "$ROOT/python"
# spawned interpreters must be started through qemu as well (module docstring of this script: step 4)
cat > "$ROOT/site/sitecustomize.py" <<EOF
import sys
sys.executable = "$ROOT/python"
EOF

echo "arm64 python: $("$ROOT/python" -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')"
export PYTHONPATH="$REPO:$ROOT/site"
export PYTHONDONTWRITEBYTECODE=1          # leave no bytecode caches of a second interpreter in the checkout
export HCCL_SIM_TEST_SLOWDOWN=${HCCL_SIM_TEST_SLOWDOWN:-10}     # tests scale their time bounds by it (tests/test_shm_control.py)
TESTS=${*:-tests/test_shm_control.py tests/test_same_host.py tests/test_hosted.py tests/test_memory.py}
# shellcheck disable=SC2086
exec "$ROOT/python" -m pytest -p no:cacheprovider -q $TESTS
