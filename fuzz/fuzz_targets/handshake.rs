//! Client bytes of a whole session: TLS mode, client flags, options, and the
//! requests that follow once negotiation reaches transmission.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_nbd::fuzzing::handshake(data);
});
