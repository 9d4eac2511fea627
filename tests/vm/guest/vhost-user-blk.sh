# Scenario vhost-user-blk, guest side: Shale runs on the host and serves /dev/vda.
# Phase 1: raw I/O, discard, ext4 with files, fstrim, a remount. Phase 2 (after
# Shale was killed with SIGKILL and restarted): the files again. Phase 3: writes,
# idles while Shale is killed and restarted under it (QEMU reconnects), then writes
# and reads again. Phase 4: fio random writes with verify, during which Shale is
# killed and restarted.
phase=$1
q=/sys/block/vda/queue
echo "GUEST phase $phase size_sectors $(cat /sys/block/vda/size) lbs $(cat $q/logical_block_size) pbs $(cat $q/physical_block_size) discard_gran $(cat $q/discard_granularity) wz_max $(cat $q/write_zeroes_max_bytes) queues $(ls /sys/block/vda/mq | wc -l) cache $(cat $q/write_cache)"
if [ "$phase" = 1 ]; then
    dd if=/dev/urandom of=/tmp/a bs=1M count=8 2>/dev/null
    dd if=/tmp/a of=/dev/vda bs=1M oflag=direct conv=fsync 2>/dev/null
    dd if=/dev/vda of=/tmp/b bs=1M count=8 iflag=direct 2>/dev/null
    echo "GUEST raw written $(md5sum < /tmp/a | cut -c1-32) read $(md5sum < /tmp/b | cut -c1-32)"
    # fio with verify on /dev/vda: 64 MiB in 128 KiB writes, then 4 KiB random
    # writes over 16 MiB after it.
    t0=$(cut -d' ' -f1 /proc/uptime)
    $HOST_LD /host/usr/bin/fio --output-format=terse --terse-version=3 --filename=/dev/vda \
        --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 --serialize_overlap=1 \
        --name=seq --rw=write --bs=128k --size=64m --offset=16m --iodepth=8 \
        --name=rand --stonewall --rw=randwrite --bs=4k --size=16m --offset=80m --iodepth=16 \
        > /tmp/fio.out 2> /tmp/fio.err
    rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    echo "GUEST fio rc $rc errors $(grep -c -i -E 'verify|error' /tmp/fio.err) seconds $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') write_kibps $(awk -F';' '$1 == 3 {print $48}' /tmp/fio.out | tr '\n' ',') read_kibps $(awk -F';' '$1 == 3 {print $7}' /tmp/fio.out | tr '\n' ',')"
    [ $rc = 0 ] || head -5 /tmp/fio.err | sed 's/^/GUEST fio.err /'
    blkdiscard -o 4194304 -l 4194304 /dev/vda && echo "GUEST blkdiscard ok"
    dd if=/dev/vda of=/tmp/z bs=1M skip=4 count=4 iflag=direct 2>/dev/null
    echo "GUEST discarded nonzero_bytes $(tr -d '\000' < /tmp/z | wc -c)"
    $HOST_LD /host/sbin/mke2fs -q -t ext4 -F /dev/vda > /tmp/mkfs.log 2>&1 && echo "GUEST mkfs ok"
    mount -t ext4 /dev/vda /mnt && echo "GUEST mount ok"
    dd if=/dev/urandom of=/mnt/big bs=1M count=16 2>/dev/null
    for i in 1 2 3 4 5 6 7 8; do echo "file $i $(date)" > /mnt/f$i; done
    rm /mnt/f3 /mnt/f5
    sync
    echo "GUEST fs big $(md5sum < /mnt/big | cut -c1-32) files $(cat /mnt/f* | md5sum | cut -c1-32)"
    echo "GUEST fstrim $(fstrim -v /mnt)"
    umount /mnt && mount -t ext4 /dev/vda /mnt
    echo "GUEST remount big $(md5sum < /mnt/big | cut -c1-32) files $(cat /mnt/f* | md5sum | cut -c1-32)"
    umount /mnt
fi
if [ "$phase" = 2 ]; then
    mount -t ext4 /dev/vda /mnt && echo "GUEST mount ok"
    echo "GUEST after-restart big $(md5sum < /mnt/big | cut -c1-32) files $(cat /mnt/f* | md5sum | cut -c1-32)"
    umount /mnt
fi
if [ "$phase" = 3 ]; then
    # Shale is killed and restarted while this guest idles; QEMU reconnects.
    dd if=/dev/urandom of=/tmp/a bs=1M count=4 2>/dev/null
    dd if=/tmp/a of=/dev/vda bs=1M oflag=direct conv=fsync 2>/dev/null
    echo "GUEST before written $(md5sum < /tmp/a | cut -c1-32)"
    echo "GUEST idle"
    sleep 12
    dd if=/dev/urandom of=/tmp/c bs=1M count=4 2>/dev/null
    dd if=/tmp/c of=/dev/vda bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null
    dd if=/dev/vda of=/tmp/b bs=1M count=4 iflag=direct 2>/dev/null
    dd if=/dev/vda of=/tmp/d bs=1M skip=8 count=4 iflag=direct 2>/dev/null
    echo "GUEST reconnected old $(md5sum < /tmp/b | cut -c1-32) new $(md5sum < /tmp/c | cut -c1-32) newread $(md5sum < /tmp/d | cut -c1-32)"
fi
if [ "$phase" = 4 ]; then
    # Writes in flight while Shale is killed and restarted under the guest, with the
    # guest's write cache on (write back) and no flush at all: every write fio saw
    # complete must still read back. A kill between a write's completion and its
    # flush would lose it (QEMU's replay of the flush would then succeed on the new
    # Shale); Shale's hand-off store is what keeps it (docs/vm.md). Eight loops of
    # write-then-verify, so the kill 3 s in lands in some loop's writes or reads.
    echo "GUEST cache mode $(tr ' ' - < /sys/block/vda/cache_type)"
    echo "GUEST loading"
    t0=$(cut -d' ' -f1 /proc/uptime)
    $HOST_LD /host/usr/bin/fio --output-format=terse --terse-version=3 --filename=/dev/vda \
        --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 --serialize_overlap=1 \
        --name=load --rw=randwrite --bs=4k --size=16m --offset=128m --iodepth=32 --loops=8 \
        > /tmp/fio.out 2> /tmp/fio.err
    rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    echo "GUEST under-kill rc $rc errors $(grep -c -i -E 'verify|error' /tmp/fio.err) seconds $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}')"
    [ $rc = 0 ] || head -5 /tmp/fio.err | sed 's/^/GUEST fio.err /'
fi
