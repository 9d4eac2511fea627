# Scenario nbd: the guest kernel's NBD client on a Shale volume. Shale runs in the
# guest (cache and capacity on two NVMe namespaces, zone emulation); nbd-client
# attaches /dev/nbd0 over Shale's unix socket; ext4 on it, files, sync, a
# remount; Shale killed with SIGKILL and restarted; the files read back.
. "$VM_GUEST/common.sh"
sock=$d/nbd.sock
mkdir -p /mnt/v
attach() {
    $HOST_LD /host/usr/sbin/nbd-client -N default -u $sock /dev/nbd0 -b 4096 > $d/nbd-client.log 2>&1 \
        || { echo "GUEST nbd-client failed: $(tr '\n' ' ' < $d/nbd-client.log)"; return 1; }
    i=0
    while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
}

insmod /lib/modules/nbd.ko nbds_max=2 || echo "GUEST nbd module failed"
$SHALE format --data-dir $d --cache /dev/ns1 --capacity /dev/ns2 --chunk-size 4MiB \
    --zone-size 16MiB > $d/format.log 2>&1 || echo "GUEST format failed: $(tail -2 $d/format.log | tr '\n' ' ')"
serve 1 --cache /dev/ns1 --capacity /dev/ns2 --unix-socket $sock || exit 0
attach || exit 0
echo "GUEST attached size_sectors $(cat /sys/block/nbd0/size) lbs $(cat /sys/block/nbd0/queue/logical_block_size)"
t0=$(cut -d' ' -f1 /proc/uptime)
$HOST_LD /host/sbin/mke2fs -q -t ext4 -F /dev/nbd0 > $d/mkfs.log 2>&1 && echo "GUEST mkfs ok" \
    || echo "GUEST mkfs failed: $(head -3 $d/mkfs.log | tr '\n' ' ')"
mount -t ext4 /dev/nbd0 /mnt/v && echo "GUEST mount ok"
dd if=/dev/urandom of=/mnt/v/big bs=1M count=24 2>/dev/null
for i in 1 2 3 4 5 6 7 8 9 10; do echo "file $i $(cat /proc/uptime)" > /mnt/v/f$i; done
rm /mnt/v/f4 /mnt/v/f7
sync
t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST fs $(sums) seconds $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}')"
umount /mnt/v && mount -t ext4 /dev/nbd0 /mnt/v && echo "GUEST remount $(sums)"
umount /mnt/v
$HOST_LD /host/usr/sbin/nbd-client -d /dev/nbd0 > /dev/null 2>&1
kill -9 $spid; wait $spid 2>/dev/null
serve 2 --cache /dev/ns1 --capacity /dev/ns2 --unix-socket $sock || exit 0
attach || exit 0
mount -t ext4 /dev/nbd0 /mnt/v && echo "GUEST after-kill $(sums)"
umount /mnt/v
$HOST_LD /host/usr/sbin/nbd-client -d /dev/nbd0 > /dev/null 2>&1
kill $spid; wait $spid
grep -E 'ERROR|panicked' $d/serve.log | head -3 | sed 's/^/GUEST serve.log /'
