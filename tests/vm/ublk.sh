#!/bin/bash
# Scenario ublk: Shale in the guest serves its volume as a kernel block device,
# /dev/ublkbN (see guest/ublk.sh for the steps). Needs a kernel with ublk_drv
# (Debian's 6.12) and a shale built with `--features ublk`.
# Usage: ublk.sh SHALE_BINARY WORK_DIR
. "$(dirname "$0")/lib.sh"
vm_initramfs nvme +ublk_drv ext4 crc32c_generic
truncate -s 128M "$work/cache.img"
truncate -s 1G "$work/capacity.img"
VM_DEVICES=ns1,ns2 vm_boot ublk 1 1G \
    -device nvme,id=nvme0,serial=shale0 \
    -drive "file=$work/cache.img,id=cache,format=raw,if=none" \
    -device nvme-ns,drive=cache,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096 \
    -drive "file=$work/capacity.img,id=cap,format=raw,if=none" \
    -device nvme-ns,drive=cap,bus=nvme0,nsid=2,logical_block_size=4096,physical_block_size=4096
check "the ublk device: 4 KiB blocks, write-back cache with FUA, 2 queues" \
    "$(field device lbs)/$(field device cache)/$(field device fua)/$(field device queues)" \
    "4096/write-back/1/2"
check "fio verify on the ublk device" "$(field fio rc)/$(field fio errors)" "0/0"
check "mkfs.ext4 and mount" "$(grep -c -E '^GUEST (mkfs|mount) ok' "$work/guest.log")" "2"
check "files survive a remount" "$(field fs big)/$(field fs files)/$(field fs count)" \
    "$(field remount big)/$(field remount files)/$(field remount count)"
check "a clean stop removes the device" "$(field stopped device_gone)" "yes"
check "files survive a restart of Shale" "$(field fs big)/$(field fs files)/$(field fs count)" \
    "$(field after-restart big)/$(field after-restart files)/$(field after-restart count)"
check "files survive kill -9 of Shale" "$(field fs big)/$(field fs files)/$(field fs count)" \
    "$(field after-kill big)/$(field after-kill files)/$(field after-kill count)"
check "no errors in Shale's log" "$(grep -c '^GUEST serve.log' "$work/guest.log")" "0"
figure "fio on the ublk device (write KiB/s per job)" "$(field fio write_kibps)"
figure "fio verify on the ublk device (read KiB/s per job)" "$(field fio read_kibps)"
vm_checks_done
