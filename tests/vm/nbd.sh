#!/bin/bash
# Scenario nbd: the guest kernel's NBD client (nbd-client) on a Shale volume with
# ext4 on it, across a kill -9 of Shale (see guest/nbd.sh for the steps).
# Usage: nbd.sh SHALE_BINARY WORK_DIR
. "$(dirname "$0")/lib.sh"
vm_initramfs nvme +nbd ext4 crc32c_generic
truncate -s 128M "$work/cache.img"
truncate -s 1G "$work/capacity.img"
VM_DEVICES=ns1,ns2 vm_boot nbd 1 1G \
    -device nvme,id=nvme0,serial=shale0 \
    -drive "file=$work/cache.img,id=cache,format=raw,if=none" \
    -device nvme-ns,drive=cache,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096 \
    -drive "file=$work/capacity.img,id=cap,format=raw,if=none" \
    -device nvme-ns,drive=cap,bus=nvme0,nsid=2,logical_block_size=4096,physical_block_size=4096
check "nbd-client attaches a 4 KiB-block device" "$(field attached lbs)" "4096"
check "mkfs.ext4 and mount" "$(grep -c -E '^GUEST (mkfs|mount) ok' "$work/guest.log")" "2"
check "files survive a remount" "$(field fs big)/$(field fs files)/$(field fs count)" \
    "$(field remount big)/$(field remount files)/$(field remount count)"
check "files survive kill -9 of Shale" "$(field fs big)/$(field fs files)/$(field fs count)" \
    "$(field after-kill big)/$(field after-kill files)/$(field after-kill count)"
check "no errors in Shale's log" "$(grep -c '^GUEST serve.log' "$work/guest.log")" "0"
figure "mkfs, 24 MiB and 10 files written, sync" "$(field fs seconds) s"
vm_checks_done
