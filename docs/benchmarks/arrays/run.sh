#!/bin/bash
# Every run of docs/benchmarks/arrays: one JSON line each.
B=./target/release/shale
out=docs/benchmarks/arrays/runs.jsonl
: > $out
run() { # system n redundancy workload bs
  nice -n 5 $B bench run --system $1 --capacity-devices $2 --capacity-redundancy $3 \
    --config quick --workload $4 --bs $5 --seed 0 --json >> $out 2>>/tmp/arrays_err.txt \
    || echo "{\"system\":\"$1\",\"layout\":\"$3\",\"workload\":\"$4\",\"bs\":\"$5\",\"error\":true}" >> $out
}
# SALSA (seed 002 §V-B): log-structured vs in-place RAID-5 on 3+1, 4 KiB random writes.
run raid-model 4 3+1 uniform 4k
run raid5f-model 4 3+1 uniform 4k
run raid-model 5 4+1 uniform 4k
run shale-zns 4 3+1 uniform 4k
run shale-zns 5 4+1 uniform 4k
run shale-zns 3 2+1 uniform 4k
# ScalaAFA (seed 001 §6.2, Fig. 9): 4 KiB and 64 KiB random, 64 KiB sequential,
# full-stripe (K x 64 KiB) sequential, on 2+1, 4+1, 6+1, 6+2.
for l in 2+1 4+1 6+1 6+2; do
  k=${l%+*}; m=${l#*+}; n=$((k+m)); fs=$((k*64))k
  for w in "uniform 4k" "uniform 64k" "seq 64k" "seq $fs"; do
    for s in raid-model raid5f-model shale-zns; do
      run $s $n $l $w
    done
    nice -n 5 $B bench run --system shale-zns --capacity-devices $n --capacity-redundancy $l \
      --cache-devices 2 --config quick --workload ${w% *} --bs ${w#* } --seed 0 --json >> $out
  done
done
