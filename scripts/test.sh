#!/usr/bin/env bash
# The project's test command: installs the reference etcd/etcdctl binaries the
# tests compare cetera against (scripts/install-test-deps.sh), then runs every
# test with cargo-nextest (installed from crates.io if missing).
# Extra arguments go to `cargo nextest run`, e.g. `scripts/test.sh --test kv`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi
cargo nextest run --no-fail-fast "$@"
