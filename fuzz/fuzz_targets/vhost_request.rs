//! Guest memory and a descriptor table from raw bytes: every chain the avail
//! ring offers goes through the virtio-blk parser and is completed as the
//! vhost-user-blk back-end would.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_vhost::fuzzing::request(data);
});
