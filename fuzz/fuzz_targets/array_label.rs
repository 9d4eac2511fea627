//! An array member's label (capacity members' zone 0, cache mirrors' first blocks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_format::fuzzing::array_label(data);
});
