# Shale inside the guest on a zoned null_blk device: memory-backed, 4 conventional
# zones first, then sequential zones of 64 MiB with 62 MiB capacity, at most 14
# open. The cache is a conventional NVMe namespace.
insmod /lib/modules/null_blk.ko nr_devices=1 zoned=1 zone_size=64 zone_capacity=62 \
    zone_nr_conv=4 zone_max_open=14 zone_max_active=14 gb=2 memory_backed=1 bs=4096 \
    || echo "GUEST null_blk failed"
CACHE=/dev/ns1
CAP=/dev/nullb0
. "$VM_GUEST/zoned.sh"
