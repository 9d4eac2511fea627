#!/usr/bin/env bash
# Short fuzzing smoke run of every target (default 30 s each).
#
#   fuzz/smoke.sh [seconds]
#
# Needs a nightly toolchain (for -Zsanitizer) and cargo-fuzz
# (`cargo install cargo-fuzz`). New corpus entries go to a scratch directory,
# so the committed seed corpus in fuzz/corpus/ is only read. Crashes land in
# fuzz/artifacts/<target>/. Without nightly, cargo-fuzz from crates.io still runs
# with RUSTC_BOOTSTRAP=1 and no sanitizer:
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -s none -O <target> <scratch> corpus/<target>
# and the stable stand-in (what `cargo xtask ci` runs without nightly) is:
#   SHALE_FUZZ_ITERS=200000 cargo test --release -p <crate> --test fuzz_corpus
# for crate in shale-nbd shale-format shale-device shale-daemon shale-vhost.
set -euo pipefail
secs="${1:-30}"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
targets="handshake request superblock capacity_label array_label md_block checkpoint journal_block handoff_image volume_table zone_table config vhost_request"
for target in $targets; do
    mkdir -p "$scratch/$target"
    echo "== fuzzing $target for ${secs}s"
    cargo +nightly fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$secs" -max_len=20480 -timeout=5
done
echo "fuzz smoke: all targets ran ${secs}s without a crash"
