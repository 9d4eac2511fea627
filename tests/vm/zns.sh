#!/bin/bash
# Scenario zns: Shale inside the guest on QEMU's emulated ZNS namespace (see
# guest/zoned.sh for the steps). Usage: zns.sh SHALE_BINARY WORK_DIR
. "$(dirname "$0")/lib.sh"
vm_initramfs nvme
truncate -s 64M "$work/cache.img"
truncate -s 2G "$work/zns.img"
VM_DEVICES=ns1,ns2 vm_boot zns 1 1G \
    -device nvme,id=nvme0,serial=shale0,zoned.zasl=5 \
    -drive "file=$work/cache.img,id=cache,format=raw,if=none" \
    -device nvme-ns,drive=cache,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096 \
    -drive "file=$work/zns.img,id=zns,format=raw,if=none" \
    -device "nvme-ns,drive=zns,bus=nvme0,nsid=2,logical_block_size=4096,physical_block_size=4096,zoned=true,zoned.zone_size=64M,zoned.zone_capacity=62M,zoned.max_open=14,zoned.max_active=14"
ZONES=32 ZONES_WHY="the drive's 32, 16 per shard" SHARDS=2
. "$(dirname "$0")/zoned-checks.sh"
