# Shared by the guest scenarios that `cargo xtask vm-test` runs (sourced, not run).
#
# A scenario script is called as `SCRIPT SHALE_BINARY WORK_DIR`. It builds the guest
# with `vm_initramfs`, starts QEMU with `vm_boot` (software emulation, no KVM), and
# reads what the guest printed: every line the guest prints that starts with GUEST
# lands in $work/guest.log. It ends with `vm_checks_done`, whose exit status is the
# verdict; `check` records one named check, `figure` one measured figure.
#
# The guest is a busybox initramfs with Debian's kernel and modules. It mounts the
# host's root read-only over virtio-9p at /host, so it runs the host's own Shale,
# fio and mke2fs (through the host's dynamic loader) instead of copies.
set -euo pipefail
vm_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
vm_repo="$(cd "$vm_here/../.." && pwd)"
shale="$(readlink -f "$1" || true)"
work="$2"
if [ ! -x "$shale" ]; then
    echo "FAIL no shale binary at $1"
    exit 1
fi
mkdir -p "$work"
: > "$work/guest.log"
vm_fail=0
vm_pids=()

vm_cleanup() {
    local p
    for p in "${vm_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
trap vm_cleanup EXIT

kernel="$(ls /boot/vmlinuz-* | sort -V | tail -1)"
kver="${kernel#/boot/vmlinuz-}"

# vm_initramfs MODULE...: /init, busybox and the named modules with their
# dependencies, loaded in order at boot.
vm_initramfs() {
    local root="$work/root" m line f
    rm -rf "$root"
    mkdir -p "$root"/{bin,proc,sys,dev,tmp,mnt,host,lib/modules}
    cp "$(command -v busybox)" "$root/bin/busybox"
    for a in $(busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"; done
    : > "$root/modules.order"
    # A module named +NAME is packed with what it needs, which is loaded at boot,
    # but not loaded itself: the guest script loads it with its parameters.
    local manual=()
    for m in virtio_pci netfs fscache 9pnet 9pnet_virtio 9p "$@"; do
        case "$m" in +*) m="${m#+}"; manual+=("$m") ;; esac
        { modprobe --show-depends -S "$kver" "$m" 2>/dev/null || true; } | while read -r line; do
            f="$(echo "$line" | awk '$1 == "insmod" {print $2}')"
            [ -n "$f" ] || continue
            local name
            name="$(basename "$f")"; name="${name%%.ko*}"
            grep -qx "$name" "$root/modules.order" && continue
            case "$f" in
                *.ko) cp "$f" "$root/lib/modules/$name.ko" ;;
                *.ko.xz) xz -dc "$f" > "$root/lib/modules/$name.ko" ;;
                *.ko.zst) zstd -qdc "$f" > "$root/lib/modules/$name.ko" ;;
            esac
            echo "$name" >> "$root/modules.order"
        done
    done
    for m in "${manual[@]}"; do
        grep -vx "$m" "$root/modules.order" > "$root/modules.tmp" || true
        mv "$root/modules.tmp" "$root/modules.order"
    done
    # How the guest runs a host program: the host's loader, and every directory the
    # programs the scenarios use take libraries from (fio's include ceph/).
    local dirs
    dirs="$(for p in "$shale" "$(command -v fio)" "$(command -v mke2fs)" "$(command -v nbd-client)"; do
        ldd "$p" | awk '/=> \// {print $3}' | xargs -n1 dirname
    done | sort -u | sed 's|^|/host|' | paste -sd: -)"
    echo "/host$(readlink -f /lib64/ld-linux-x86-64.so.2) --library-path $dirs" > "$root/host_ld"
    install -m 0755 "$vm_here/init" "$root/init"
    (cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$work/initramfs.gz"
}

# vm_boot NAME PHASE MEMORY [QEMU ARGS...]: boots the guest, which runs
# tests/vm/guest/NAME.sh PHASE, and waits for it to power off (at most 300 s).
# Everything QEMU and the guest's console print is kept in
# $work/console-NAME-PHASE.log (the work directory stays when a scenario fails).
# NVMe namespaces appear in the guest as /dev/nsN (N the namespace id); set
# VM_DEVICES (e.g. "ns1,ns2") to have the guest wait for them.
vm_boot() {
    local name="$1" phase="$2" mem="$3"
    shift 3
    local t0
    t0=$(date +%s)
    timeout 300 qemu-system-x86_64 -machine q35,accel=tcg -cpu max -m "$mem" -smp 2 \
        -kernel "$kernel" -initrd "$work/initramfs.gz" \
        -append "console=ttyS0 panic=-1 quiet shale_scenario=$name shale_phase=$phase shale_repo=$vm_repo shale_bin=$shale shale_devices=${VM_DEVICES:-}" \
        -nographic -no-reboot \
        -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on" \
        "$@" 2>&1 | stdbuf -oL tr -d '\r' | tee -a "$work/console-$name-$phase.log" |
        grep --line-buffered -E '^GUEST' | tee -a "$work/guest.log" || true
    figure "$name phase $phase wall" "$(( $(date +%s) - t0 )) s"
}

# field KEY WORD: the word after WORD on the last guest line starting "GUEST KEY".
field() {
    grep -E "^GUEST $1( |$)" "$work/guest.log" | tail -1 |
        awk -v k="$2" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'
}

# check NAME GOT WANT: one check; passes when GOT equals WANT and is not empty.
check() {
    # Empty fields joined by separators are still empty.
    if [ -n "$(printf '%s' "$2" | tr -d '/ ')" ] && [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        echo "FAIL $1: got '$2', want '$3'"
        vm_fail=1
    fi
}

# figure NAME VALUE: a measured figure, for the run's summary.
figure() { echo "figure $1: $2"; }

vm_checks_done() {
    if [ "$(grep -c '^GUEST done' "$work/guest.log")" -lt "${1:-1}" ]; then
        echo "FAIL the guest did not finish (see $work/guest.log)"
        vm_fail=1
    fi
    exit "$vm_fail"
}
