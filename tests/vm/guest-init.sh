#!/bin/sh
# /init of the guest that tests/vm/vhost-guest.sh boots: loads the virtio and ext4
# modules, then (shale_phase=1 on the kernel command line) raw I/O, discard, a
# filesystem, fstrim and a remount on /dev/vda, or (shale_phase=2) mounts it again
# after Shale's restart, or (shale_phase=3) writes, idles while Shale is killed and
# restarted under it, then writes and reads again. Each result is a line starting GUEST on the console.
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk crc16 mbcache jbd2 crc32c_generic crc32c-intel ext4; do
    insmod /lib/modules/$m.ko || echo "GUEST insmod $m failed"
done
sleep 1
echo "GUEST virtio devices: $(ls /sys/bus/virtio/devices) blocks: $(ls /sys/block)"; dmesg | grep -i -E "virtio|vda" | sed "s/^/GUEST dmesg /" | head -5
phase=$(sed -n 's/.*shale_phase=\([0-9]\).*/\1/p' /proc/cmdline)
q=/sys/block/vda/queue
echo "GUEST phase $phase size_sectors $(cat /sys/block/vda/size) lbs $(cat $q/logical_block_size) pbs $(cat $q/physical_block_size) discard_gran $(cat $q/discard_granularity) wz_max $(cat $q/write_zeroes_max_bytes) queues $(ls /sys/block/vda/mq | wc -l) cache $(cat $q/write_cache)"
if [ "$phase" = 1 ]; then
    dd if=/dev/urandom of=/tmp/a bs=1M count=8 2>/dev/null
    dd if=/tmp/a of=/dev/vda bs=1M oflag=direct conv=fsync 2>/dev/null
    dd if=/dev/vda of=/tmp/b bs=1M count=8 iflag=direct 2>/dev/null
    echo "GUEST raw written $(md5sum < /tmp/a | cut -c1-32) read $(md5sum < /tmp/b | cut -c1-32)"
    blkdiscard -o 4194304 -l 4194304 /dev/vda && echo "GUEST blkdiscard ok"
    dd if=/dev/vda of=/tmp/z bs=1M skip=4 count=4 iflag=direct 2>/dev/null
    echo "GUEST discarded nonzero_bytes $(tr -d '\000' < /tmp/z | wc -c)"
    mke2fs -q /dev/vda && echo "GUEST mkfs ok"
    mount -t ext4 /dev/vda /mnt && echo "GUEST mount ok"
    dd if=/dev/urandom of=/mnt/big bs=1M count=16 2>/dev/null
    for i in 1 2 3 4 5 6 7 8; do echo "file $i $(date)" > /mnt/f$i; done
    rm /mnt/f3 /mnt/f5
    sync
    echo "GUEST fs big $(md5sum < /mnt/big | cut -c1-32) files $(cat /mnt/f* | md5sum | cut -c1-32)"
    fstrim -v /mnt
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
    sleep 25
    dd if=/dev/urandom of=/tmp/c bs=1M count=4 2>/dev/null
    dd if=/tmp/c of=/dev/vda bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null
    dd if=/dev/vda of=/tmp/b bs=1M count=4 iflag=direct 2>/dev/null
    dd if=/dev/vda of=/tmp/d bs=1M skip=8 count=4 iflag=direct 2>/dev/null
    echo "GUEST reconnected old $(md5sum < /tmp/b | cut -c1-32) new $(md5sum < /tmp/c | cut -c1-32) newread $(md5sum < /tmp/d | cut -c1-32)"
fi
echo "GUEST done"
sync
poweroff -f
