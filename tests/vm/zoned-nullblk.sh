#!/bin/bash
# Scenario zoned-nullblk: Shale inside the guest on a memory-backed zoned null_blk
# device with conventional zones first (see guest/zoned.sh for the steps).
# Usage: zoned-nullblk.sh SHALE_BINARY WORK_DIR
. "$(dirname "$0")/lib.sh"
vm_initramfs nvme +null_blk
truncate -s 64M "$work/cache.img"
VM_DEVICES=ns1 vm_boot zoned-nullblk 1 2G \
    -device nvme,id=nvme0,serial=shale0 \
    -drive "file=$work/cache.img,id=cache,format=raw,if=none" \
    -device nvme-ns,drive=cache,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096
ZONES=31 ZONES_WHY="28 sequential and 3 emulated on the 4 conventional"
. "$(dirname "$0")/zoned-checks.sh"
