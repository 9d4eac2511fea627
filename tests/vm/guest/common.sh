# Sourced by the guest scenarios that run Shale inside the guest: its data
# directory, and `serve N ARGS...`, which starts `shale serve --data-dir $d ARGS...`
# in the background (its pid in $spid) and waits until its log says ready for the
# N-th time, or says why not on a GUEST line and returns 1.
d=/tmp/shale
mkdir -p $d
serve() {
    n=$1
    shift
    $SHALE serve --data-dir $d "$@" --log-level info >> $d/serve.log 2>&1 &
    spid=$!
    i=0
    while [ $i -lt 600 ]; do
        [ "$(grep -c 'serve: ready' $d/serve.log)" -ge "$n" ] && return 0
        kill -0 $spid 2>/dev/null || break
        sleep 0.2; i=$((i + 1))
    done
    echo "GUEST serve failed"
    { grep -v '^ ' $d/serve.log | grep -B2 -A2 -m2 panicked || tail -5 $d/serve.log; } | sed 's/^/GUEST serve.log /'
    return 1
}
# The files of the ext4 scenarios: a big one's sum, the small ones' sum, how many.
sums() { echo "big $(md5sum < /mnt/v/big | cut -c1-32) files $(cat /mnt/v/f* | md5sum | cut -c1-32) count $(ls /mnt/v | wc -l)"; }
