# Sourced by the zoned guest scenarios (zns.sh, zoned-nullblk.sh) with CACHE and
# CAP set: Shale on the zoned drive inside the guest. Formats, writes and verifies
# with fio through NBD, kills Shale with SIGKILL, recovers (write pointers from the
# drive) and verifies again, then writes more and verifies after a clean restart.
. "$VM_GUEST/common.sh"
sock=$d/nbd.sock
name=$(basename "$(readlink -f "$CAP")")
q=/sys/block/$name/queue
echo "GUEST drive $name zoned $(cat $q/zoned) zones $(cat $q/nr_zones) zone_sectors $(cat $q/chunk_sectors) max_open $(cat $q/max_open_zones) max_active $(cat $q/max_active_zones) lbs $(cat $q/logical_block_size)"
# fio through NBD: 48 MiB in 128 KiB writes, then 4 MiB beyond it in 4 KiB
# random writes, each block with a crc32c fio verifies. The data follows the
# seed, so a verify-only run with the seed of the last write checks all of it;
# each write run ends with a flush (end_fsync), which is what makes it durable.
fio_job() {
    label=$1
    seed=$2
    shift 2
    t0=$(cut -d' ' -f1 /proc/uptime)
    $HOST_LD /host/usr/bin/fio --output-format=terse --terse-version=3 \
        --ioengine=nbd --uri="nbd+unix:///default?socket=$sock" \
        --verify=crc32c --verify_fatal=1 --serialize_overlap=1 --randseed=$seed "$@" \
        --name=seq --rw=write --bs=128k --size=48m --iodepth=8 \
        --name=rand --stonewall --rw=randwrite --bs=4k --size=4m --offset=48m --iodepth=16 \
        > $d/fio.out 2> $d/fio.err
    rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    # Terse v3: field 7 is read KiB/s, 48 write KiB/s of each job.
    echo "GUEST fio $label rc $rc errors $(grep -c -i -E 'verify|error' $d/fio.err) seconds $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') write_kibps $(awk -F';' '$1 == 3 {print $48}' $d/fio.out | tr '\n' ',') read_kibps $(awk -F';' '$1 == 3 {print $7}' $d/fio.out | tr '\n' ',')"
    [ $rc = 0 ] || head -5 $d/fio.err | sed 's/^/GUEST fio.err /'
}
stat_of() { $SHALE stats --json --data-dir $d | tr ',{}' '\n\n\n' | grep "\"$1\"" | head -1 | cut -d: -f2 | tr -d ' '; }

# SHARDS (set by the scenario): engine shards, each with a run of the drive's zones.
printf '[engine]\nshards = %s\n' "${SHARDS:-1}" > $d/shale.toml
$SHALE format --config $d/shale.toml --data-dir $d --cache "$CACHE" --capacity "$CAP" --chunk-size 4MiB \
    > $d/format.log 2>&1 && echo "GUEST format ok" || { echo "GUEST format failed"; tail -5 $d/format.log | sed 's/^/GUEST format.log /'; }
# The pool's zones (every shard's), and how many shards.
echo "GUEST zones $(grep -o 'detail=[0-9]* zones' $d/format.log | grep -o '[0-9]*') shards $(grep -o '[0-9]* shards of' $d/format.log | grep -o '^[0-9]*' || echo 1)"
serve_zoned() {
    serve "$1" --cache "$CACHE" --capacity "$CAP" --unix-socket $sock --scrub-speed 64MiB
}
serve_zoned 1 || exit 0
fio_job write 11 --do_verify=1 --end_fsync=1
echo "GUEST written capacity_compaction $(stat_of capacity_compaction_written)"
kill -9 $spid; wait $spid 2>/dev/null
serve_zoned 2 || exit 0
echo "GUEST recovery $(grep -m1 'dirty recovery' $d/serve.log | grep -o 'wall_ms=[0-9.]*')"
fio_job after-kill 11 --verify_only=1
fio_job rewrite 12 --do_verify=1 --end_fsync=1
kill $spid; wait $spid
serve_zoned 3 || exit 0
echo "GUEST clean-open $(grep 'opened after a clean' $d/serve.log | tail -1 | grep -o 'wall_ms=[0-9.]*')"
fio_job after-restart 12 --verify_only=1
echo "GUEST scrub mapping_errors $(stat_of scrub_mapping_errors) check"
kill $spid; wait $spid
# The offline checker finds the pool (every shard of it) as the daemon left it.
$SHALE check --cache "$CACHE" --capacity "$CAP" --data > $d/check.log 2>&1
echo "GUEST check rc $? $(grep -o 'result: .*' $d/check.log | head -1)"
[ -s $d/check.log ] && grep -q 'result: no problems' $d/check.log || tail -5 $d/check.log | sed 's/^/GUEST check.log /'
grep -E 'ERROR|panicked' $d/serve.log | head -3 | sed 's/^/GUEST serve.log /'
