//! A checkpoint area: header, region state table, volume table, L2P directories.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::checkpoint(data);
});
