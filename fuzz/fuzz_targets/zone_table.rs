//! Zone emulation metadata (geometry copies and zone table slots), decoded and
//! opened as a device.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shale_device::fuzzing::zone_table(data);
});
