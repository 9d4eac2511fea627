# Shale inside the guest on QEMU's emulated ZNS namespace (64 MiB zones of 62 MiB
# capacity, at most 14 open): the cache on a conventional namespace of the same
# controller.
CACHE=/dev/ns1
CAP=/dev/ns2
. "$VM_GUEST/zoned.sh"
