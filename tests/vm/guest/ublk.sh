# Scenario ublk, guest side: Shale runs in the guest (cache and capacity on two
# NVMe namespaces, zone emulation) and serves its volume as /dev/ublkbN. fio
# verify on it, mkfs.ext4, files, sync, a remount; Shale stopped and started again
# (a new device), the files again; then killed with SIGKILL and restarted.
. "$VM_GUEST/common.sh"
mkdir -p /mnt/v
insmod /lib/modules/ublk_drv.ko || echo "GUEST ublk_drv failed"
serve_ublk() {
    serve "$1" --cache /dev/ns1 --capacity /dev/ns2 --unix-socket $d/nbd.sock \
        --ublk default --ublk-queues 2 || return 1
    dev=$(grep 'serving ublk' $d/serve.log | tail -1 | grep -o '/dev/ublkb[0-9]*')
    [ -n "$dev" ] || { echo "GUEST serve failed: no ublk device in the log"; return 1; }
    i=0
    while [ ! -b "$dev" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
}

$SHALE format --data-dir $d --cache /dev/ns1 --capacity /dev/ns2 --chunk-size 4MiB \
    --zone-size 16MiB > $d/format.log 2>&1 || echo "GUEST format failed: $(tail -2 $d/format.log | tr '\n' ' ')"
serve_ublk 1 || exit 0
b=$(basename $dev)
echo "GUEST device $dev size_sectors $(cat /sys/block/$b/size) lbs $(cat /sys/block/$b/queue/logical_block_size) cache $(tr " " - < /sys/block/$b/queue/write_cache) fua $(cat /sys/block/$b/queue/fua) discard_max $(cat /sys/block/$b/queue/discard_max_bytes) queues $(ls /sys/block/$b/mq | wc -l)"
t0=$(cut -d' ' -f1 /proc/uptime)
$HOST_LD /host/usr/bin/fio --output-format=terse --terse-version=3 --filename=$dev \
    --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 --serialize_overlap=1 \
    --name=seq --rw=write --bs=128k --size=64m --iodepth=8 \
    --name=rand --stonewall --rw=randwrite --bs=4k --size=16m --offset=64m --iodepth=16 \
    > $d/fio.out 2> $d/fio.err
rc=$?
t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST fio rc $rc errors $(grep -c -i -E 'verify|error' $d/fio.err) seconds $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') write_kibps $(awk -F';' '$1 == 3 {print $48}' $d/fio.out | tr '\n' ',') read_kibps $(awk -F';' '$1 == 3 {print $7}' $d/fio.out | tr '\n' ',')"
[ $rc = 0 ] || head -5 $d/fio.err | sed 's/^/GUEST fio.err /'
$HOST_LD /host/sbin/mke2fs -q -t ext4 -F $dev > $d/mkfs.log 2>&1 && echo "GUEST mkfs ok" \
    || echo "GUEST mkfs failed: $(head -3 $d/mkfs.log | tr '\n' ' ')"
mount -t ext4 $dev /mnt/v && echo "GUEST mount ok"
dd if=/dev/urandom of=/mnt/v/big bs=1M count=24 2>/dev/null
for i in 1 2 3 4 5 6 7 8 9 10; do echo "file $i $(cat /proc/uptime)" > /mnt/v/f$i; done
rm /mnt/v/f4 /mnt/v/f7
sync
echo "GUEST fs $(sums)"
echo "GUEST fstrim $(fstrim -v /mnt/v)"
umount /mnt/v && mount -t ext4 $dev /mnt/v && echo "GUEST remount $(sums)"
umount /mnt/v
kill $spid; wait $spid
echo "GUEST stopped rc $? device_gone $([ -b $dev ] && echo no || echo yes)"
serve_ublk 2 || exit 0
mount -t ext4 $dev /mnt/v && echo "GUEST after-restart $(sums)"
umount /mnt/v
kill -9 $spid; wait $spid 2>/dev/null
serve_ublk 3 || exit 0
mount -t ext4 $dev /mnt/v && echo "GUEST after-kill $(sums)"
umount /mnt/v
kill $spid; wait $spid
grep -E 'ERROR|panicked' $d/serve.log | head -3 | sed 's/^/GUEST serve.log /'
