//! Transmission request streams judged against a chosen session, and the
//! same bytes through the client-side reply decoders.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_nbd::fuzzing::requests(data);
});
