# Shale inside the guest on QEMU's emulated ZNS namespace (64 MiB zones of 62 MiB
# capacity, at most 14 open), as two engine shards of 16 zones and 7 open zones
# each: the cache on a conventional namespace of the same controller.
SHARDS=2
CACHE=/dev/ns1
CAP=/dev/ns2
. "$VM_GUEST/zoned.sh"
