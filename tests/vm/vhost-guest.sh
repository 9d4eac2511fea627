#!/bin/bash
# A Linux guest on a Shale volume through vhost-user-blk, under QEMU with software
# emulation (no KVM needed; boots in 15-35 s): raw writes and reads, blkdiscard, a
# filesystem with files, fstrim (the trims must reach Shale's stats), a remount; then
# Shale is killed with SIGKILL and restarted, a new guest boots and finds every file;
# last, Shale is killed and restarted under a running, idle guest, which QEMU
# reconnects (`reconnect=1`), and the guest's old and new data read back.
# Not part of `cargo xtask ci` (minutes, and packages CI does not need):
#
#   cargo build --release -p shale-cli && tests/vm/vhost-guest.sh [path/to/shale]
#
# Installs qemu-system-x86, busybox-static, linux-image-amd64 and cpio with apt-get
# when missing (as root), together with qemu-utils so apt keeps the test suite's tools.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shale="${1:-$here/../../target/release/shale}"
[ -x "$shale" ] || { echo "no shale binary at $shale (cargo build --release -p shale-cli)"; exit 2; }
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need+=(busybox-static)
ls /boot/vmlinuz-* >/dev/null 2>&1 || need+=(linux-image-amd64)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" qemu-utils
fi
kernel="$(ls /boot/vmlinuz-* | sort -V | tail -1)"
kver="${kernel#/boot/vmlinuz-}"
busybox="$(command -v busybox)"
work="$(mktemp -d /dev/shm/shale-vm.XXXXXX)"
spid=""
cleanup() { [ -n "$spid" ] && kill -9 "$spid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# The initramfs: static busybox, the modules, the test as /init.
root="$work/root"
mkdir -p "$root"/{bin,proc,sys,dev,tmp,mnt,lib/modules}
cp "$busybox" "$root/bin/busybox"
for a in $("$busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"; done
for m in virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk \
         crc16 mbcache jbd2 crc32c_generic crc32c-intel ext4; do
    f="$(modinfo -k "$kver" -n "$m" 2>/dev/null || true)"
    case "$f" in
        *.ko) cp "$f" "$root/lib/modules/$m.ko" ;;
        *.ko.xz) xz -dc "$f" > "$root/lib/modules/$m.ko" ;;
        *.ko.zst) zstd -qdc "$f" > "$root/lib/modules/$m.ko" ;;
    esac
done
install -m 0755 "$here/guest-init.sh" "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$work/initramfs.gz"

data="$work/data"; sock="$work/vm.sock"; log="$work/serve.log"
start_shale() {
    "$shale" serve --data-dir "$data" --cache-size 256MiB --capacity-size 2GiB \
        --chunk-size 4MiB --zone-size 16MiB --default-volume-size 1GiB \
        --vhost-user-blk "default=$sock" --vhost-queues 2 >> "$log" 2>&1 &
    spid=$!
    for _ in $(seq 300); do
        [ "$(grep -c 'serve: ready' "$log" 2>/dev/null || true)" -ge "$1" ] && return 0
        sleep 0.1
    done
    echo "shale did not start:"; cat "$log"; exit 1
}
boot() {
    local chardev="socket,id=c0,path=$sock"
    [ "$1" = 3 ] && chardev="$chardev,reconnect=1"
    timeout 600 qemu-system-x86_64 -machine q35,accel=tcg -m 512M -smp 2 \
        -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem \
        -kernel "$kernel" -initrd "$work/initramfs.gz" \
        -append "console=ttyS0 panic=-1 quiet shale_phase=$1" -nographic -no-reboot \
        -chardev "$chardev" \
        -device vhost-user-blk-pci,chardev=c0,num-queues=2 2>&1 | tr -d '\r' \
        | grep -E '^GUEST|bytes trimmed' | tee -a "$work/guest.log"
}
field() { grep -E "^GUEST $1" "$work/guest.log" | tail -1 | awk -v k="$2" '{for (i=1;i<NF;i++) if ($i==k) print $(i+1)}'; }

start_shale 1
t=$(date +%s); boot 1; echo "phase 1: $(( $(date +%s) - t )) s"
trimmed="$("$shale" stats --json --data-dir "$data" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"]["user_trimmed"])')"
kill -9 "$spid"; wait "$spid" 2>/dev/null || true
start_shale 2
grep -m1 'dirty recovery' "$log" | sed 's/.*wall_ms=\([0-9.]*\).*/recovery after kill -9: \1 ms/'
t=$(date +%s); boot 2; echo "phase 2: $(( $(date +%s) - t )) s"
# A guest that stays up while Shale is killed and restarted under it.
boot 3 &
qpid=$!
for _ in $(seq 1200); do grep -q '^GUEST idle' "$work/guest.log" && break; sleep 0.1; done
kill -9 "$spid"; wait "$spid" 2>/dev/null || true
start_shale 3
wait "$qpid" || true
echo "phase 3: Shale killed and restarted under a running guest"
kill -TERM "$spid"; wait "$spid"; spid=""

fail=0
check() { if [ "$2" = "$3" ] && [ -n "$2" ]; then echo "ok   $1"; else echo "FAIL $1: '$2' vs '$3'"; fail=1; fi; }
check "device is 1 GiB, 4 KiB blocks, 2 queues" "$(field 'phase 1' size_sectors)/$(field 'phase 1' lbs)/$(field 'phase 1' queues)" "2097152/4096/2"
check "raw 8 MiB reads back" "$(field raw written)" "$(field raw read)"
check "a discarded range reads zeros" "$(field discarded nonzero_bytes)" "0"
check "files survive a remount" "$(field 'fs' big)$(field 'fs' files)" "$(field remount big)$(field remount files)"
check "files survive kill -9 of Shale" "$(field 'fs' big)$(field 'fs' files)" "$(field after-restart big)$(field after-restart files)"
check "a running guest reconnects: old data" "$(field before written)" "$(field reconnected old)"
check "a running guest reconnects: new writes" "$(field reconnected new)" "$(field reconnected newread)"
if [ "${trimmed:-0}" -gt 0 ]; then echo "ok   fstrim reached Shale ($trimmed bytes trimmed)"; else echo "FAIL no trim reached Shale"; fail=1; fi
exit $fail
