# Shale inside the guest on zoned null_blk (as zoned-nullblk.sh) as two engine
# shards: shard 0 the zones emulated on the 4 conventional zones and 14 sequential
# ones, shard 1 the other 14; 7 open zones each.
SHARDS=2
. "$VM_GUEST/zoned-nullblk.sh"
