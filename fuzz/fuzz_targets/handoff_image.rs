//! The hand-off image a killed process leaves on tmpfs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::handoff_image(data);
});
