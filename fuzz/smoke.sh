#!/usr/bin/env bash
# Short fuzzing smoke run of every target (default 30 s each).
#
#   fuzz/smoke.sh [seconds]
#
# Needs a nightly toolchain (for -Zsanitizer) and cargo-fuzz
# (`cargo install cargo-fuzz`). New corpus entries go to a scratch directory,
# so the committed seed corpus in fuzz/corpus/ is only read. Crashes land in
# fuzz/artifacts/<target>/. Without nightly, the stable stand-in is:
#   SHALE_FUZZ_ITERS=200000 cargo test -p shale-nbd --test fuzz_corpus
set -euo pipefail
secs="${1:-30}"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in handshake request; do
    mkdir -p "$scratch/$target"
    echo "== fuzzing $target for ${secs}s"
    cargo +nightly fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$secs" -max_len=4096 -timeout=5
done
echo "fuzz smoke: all targets ran ${secs}s without a crash"
