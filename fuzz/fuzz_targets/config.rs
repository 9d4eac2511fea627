//! The `shale serve` configuration file (TOML), parsed, validated and printed back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_daemon::fuzzing::config(data);
});
