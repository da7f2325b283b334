#!/usr/bin/env bash
# The project's test command (README.md): setup, formatting and lint gates, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace 2>&1 | tee target/test.log
# A short fuzz run of every target (scripts/fuzz.sh SECONDS for a longer one).
./scripts/fuzz.sh 20
# One summary line for humans and CI.
passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' target/test.log | awk '{s+=$4} END {print s+0}')
echo "uraid tests: ${passed} passed, 0 failed"
