# The verdict of a zoned scenario (sourced after its guest ran guest/zoned.sh).
check "the capacity is a zoned drive" "$(field drive zoned)" "host-managed"
check "format on the zoned drive" "$(grep -c '^GUEST format ok' "$work/guest.log")" "1"
check "the pool's zones: $ZONES_WHY" "$(field zones zones)" "$ZONES"
check "engine shards" "$(field zones shards)" "${SHARDS:-1}"
check "fio verify after writing" "$(field 'fio write' rc)/$(field 'fio write' errors)" "0/0"
cap="$(field written capacity_compaction)"
if [ "${cap:-0}" -gt 0 ]; then echo "ok   compaction wrote $cap bytes to the zoned drive"; else echo "FAIL nothing reached the zoned drive"; vm_fail=1; fi
check "fio verify after kill -9 and recovery" "$(field 'fio after-kill' rc)/$(field 'fio after-kill' errors)" "0/0"
check "fio verify after rewriting" "$(field 'fio rewrite' rc)/$(field 'fio rewrite' errors)" "0/0"
check "fio verify after a clean restart" "$(field 'fio after-restart' rc)/$(field 'fio after-restart' errors)" "0/0"
check "the scrub finds no mapping errors" "$(field scrub mapping_errors)" "0"
check "shale check --data finds nothing" "$(field check rc)" "0"
check "no errors in Shale's log" "$(grep -c '^GUEST serve.log' "$work/guest.log")" "0"
figure "fio write (write KiB/s per job)" "$(field 'fio write' write_kibps)"
figure "fio verify after kill -9 (read KiB/s per job)" "$(field 'fio after-kill' read_kibps)"
figure "recovery after kill -9" "$(grep '^GUEST recovery' "$work/guest.log" | grep -o 'wall_ms=[0-9.]*' | cut -d= -f2) ms"
vm_checks_done
