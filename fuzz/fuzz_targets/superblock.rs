//! The cache device's superblock, as either copy (blocks 0 and 1) holds it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::superblock(data);
});
