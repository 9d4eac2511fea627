#!/bin/bash
# Scenario vhost-user-blk: Shale on the host serves a volume over vhost-user-blk to a
# guest that sees /dev/vda (see guest/vhost-user-blk.sh for the guest's steps).
# Between boots Shale is killed with SIGKILL and restarted; then it is killed and
# restarted under a running, idle guest, which QEMU reconnects (`reconnect=1`), and
# last under a guest with writes in flight (fio with verify).
# Usage: vhost-user-blk.sh SHALE_BINARY WORK_DIR
# SHALE_VM_SERVE_FLAGS: extra flags for shale serve (e.g. --handoff-dir off, to see
# the kill under load lose writes without the hand-off store).
. "$(dirname "$0")/lib.sh"
vm_initramfs virtio_blk ext4 crc32c_generic
data="$work/data"; sock="$work/vm.sock"; log="$work/serve.log"
spid=""
start_shale() {
    "$shale" serve --data-dir "$data" --cache-size 256MiB --capacity-size 2GiB \
        --chunk-size 4MiB --zone-size 16MiB --default-volume-size 1GiB \
        --vhost-user-blk "default=$sock" --vhost-queues 2 ${SHALE_VM_SERVE_FLAGS:-} >> "$log" 2>&1 &
    spid=$!
    vm_pids+=("$spid")
    for _ in $(seq 300); do
        [ "$(grep -c 'serve: ready' "$log" 2>/dev/null || true)" -ge "$1" ] && return 0
        sleep 0.1
    done
    echo "FAIL shale did not start:"; tail -5 "$log"; exit 1
}
boot() {
    local chardev="socket,id=c0,path=$sock"
    [ "$1" -ge 3 ] && chardev="$chardev,reconnect=1"
    vm_boot vhost-user-blk "$1" 512M \
        -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem \
        -chardev "$chardev" -device vhost-user-blk-pci,chardev=c0,num-queues=2
}

start_shale 1
boot 1
trimmed="$("$shale" stats --json --data-dir "$data" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"]["user_trimmed"])')"
kill -9 "$spid"; wait "$spid" 2>/dev/null || true
start_shale 2
figure "recovery after kill -9" "$(grep -m1 'dirty recovery' "$log" | grep -o 'wall_ms=[0-9.]*' | cut -d= -f2) ms"
boot 2
# A guest that stays up while Shale is killed and restarted under it.
boot 3 &
qpid=$!
for _ in $(seq 1200); do grep -q '^GUEST idle' "$work/guest.log" && break; sleep 0.1; done
kill -9 "$spid"; wait "$spid" 2>/dev/null || true
start_shale 3
wait "$qpid" || true
# A guest writing when Shale is killed: QEMU reconnects and the writes in flight go
# to the new Shale (QEMU hands the unanswered ones out again).
boot 4 &
qpid=$!
for _ in $(seq 1200); do grep -q '^GUEST loading' "$work/guest.log" && break; sleep 0.1; done
sleep 3
kill -9 "$spid"; wait "$spid" 2>/dev/null || true
start_shale 4
wait "$qpid" || true
figure "hand-off after the kill under load" "$(grep 'step="hand-off"' "$log" | tail -1 | sed 's/.*detail=//')"
kill -TERM "$spid"; wait "$spid" || true

check "device is 1 GiB, 4 KiB blocks, 2 queues" "$(field 'phase 1' size_sectors)/$(field 'phase 1' lbs)/$(field 'phase 1' queues)" "2097152/4096/2"
check "raw 8 MiB reads back" "$(field raw written)" "$(field raw read)"
check "fio verify on /dev/vda" "$(field fio rc)/$(field fio errors)" "0/0"
figure "fio on /dev/vda (write KiB/s per job)" "$(field fio write_kibps)"
figure "fio verify on /dev/vda (read KiB/s per job)" "$(field fio read_kibps)"
check "a discarded range reads zeros" "$(field discarded nonzero_bytes)" "0"
check "files survive a remount" "$(field fs big)$(field fs files)" "$(field remount big)$(field remount files)"
check "files survive kill -9 of Shale" "$(field fs big)$(field fs files)" "$(field after-restart big)$(field after-restart files)"
check "a running guest reconnects: old data" "$(field before written)" "$(field reconnected old)"
check "a running guest reconnects: new writes" "$(field reconnected new)" "$(field reconnected newread)"
check "the guest's write cache is on" "$(field cache mode)" "write-back"
check "writes in flight across a kill -9 complete and verify" "$(field under-kill rc)/$(field under-kill errors)" "0/0"
if [ "${trimmed:-0}" -gt 0 ]; then echo "ok   fstrim reached Shale ($trimmed bytes trimmed)"; else echo "FAIL no trim reached Shale"; vm_fail=1; fi
vm_checks_done 4
