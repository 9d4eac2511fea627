#!/bin/bash
# Scenario zoned-nullblk-shards: as zoned-nullblk, with two engine shards: shard 0
# has the zones emulated on the conventional zones and half the sequential ones,
# shard 1 the other half. Usage: zoned-nullblk-shards.sh SHALE_BINARY WORK_DIR
. "$(dirname "$0")/lib.sh"
vm_initramfs nvme +null_blk
truncate -s 64M "$work/cache.img"
VM_DEVICES=ns1 vm_boot zoned-nullblk-shards 1 2G \
    -device nvme,id=nvme0,serial=shale0 \
    -drive "file=$work/cache.img,id=cache,format=raw,if=none" \
    -device nvme-ns,drive=cache,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096
SHARDS=2 ZONES=31 ZONES_WHY="3 emulated on the 4 conventional and 14 sequential, then 14 sequential"
. "$(dirname "$0")/zoned-checks.sh"
