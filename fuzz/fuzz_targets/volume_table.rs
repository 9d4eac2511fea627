//! The volume table block, version 1 or 2.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::volume_table(data);
});
