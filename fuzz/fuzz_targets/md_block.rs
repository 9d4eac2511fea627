//! An md block (a group's P2L map), whole and entry by entry.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::md_block(data);
});
