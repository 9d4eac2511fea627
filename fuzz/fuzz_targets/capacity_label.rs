//! The capacity label at the start of zone 0 of the capacity device.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::capacity_label(data);
});
