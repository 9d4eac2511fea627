//! One journal ring block and its records.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::journal_block(data);
});
