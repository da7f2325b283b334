#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20) on the stable toolchain: cargo-fuzz
# with the sanitizer off (-s none), libFuzzer's coverage guidance still on. Starts from the
# committed corpus (fuzz/corpus/TARGET) copied under target/, so new inputs never dirty the
# tree; a crash leaves its input in target/fuzz-artifacts/TARGET and fails the script.
#   scripts/fuzz.sh          # the short run in scripts/test.sh
#   scripts/fuzz.sh 600      # a longer run; `cargo fuzz cmin` can fold finds back into fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
command -v cargo-fuzz >/dev/null 2>&1 || { echo "fuzz: cargo-fuzz missing (scripts/setup.sh installs it)" >&2; exit 1; }
for t in ${FUZZ_TARGETS:-superblock nbd_wire nbd_options psk_file map_page http_head bitmap journal config}; do
  work="target/fuzz-corpus/$t"
  art="target/fuzz-artifacts/$t"
  rm -rf "$work" && mkdir -p "$work" "$art"
  cp fuzz/corpus/$t/* "$work/"
  echo "fuzz: $t for ${secs}s"
  log="target/fuzz-$t.log"
  status=0
  cargo fuzz run "$t" -s none --fuzz-dir fuzz -- "$work" \
    -max_total_time="$secs" -artifact_prefix="$art/" -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E "^(stat::number_of_executed_units|stat::average_exec_per_sec|SUMMARY|==[0-9]+== ERROR)|panicked" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 30 "$log" >&2
    echo "fuzz: $t failed (exit $status); crashing input in $art/" >&2
    exit 1
  fi
done
echo "fuzz: no crash"
