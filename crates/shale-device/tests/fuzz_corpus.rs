//! Stable-toolchain stand-in for the zone emulation metadata fuzzer
//! (`fuzz/fuzz_targets/zone_table.rs`): the committed seeds, then seeded random and
//! mutated inputs, through `shale_device::fuzzing::zone_table` (driver in
//! `fuzz/standin.rs`).
//!
//! `SHALE_FUZZ_ITERS` raises the number of inputs (default 3000; this target
//! takes a third of it).
//! `cargo test -p shale-device --test fuzz_corpus -- --ignored write_seed_corpus`
//! regenerates the `v2-` seeds by formatting and writing small emulated devices
//! (version-2 metadata, the table block by block). The seeds without the prefix are
//! version-1 images (one whole table) written by an earlier build: kept, not
//! regenerated, so that format stays covered.

#[path = "../../../fuzz/standin.rs"]
mod standin;

use shale_device::{
    fuzzing, BlockDevice, MemDevice, ZoneAction, ZoneEmu, ZoneEmuConfig, ZonedDevice,
};
use standin::Entry;

fn targets() -> [Entry; 1] {
    [Entry {
        name: "zone_table",
        run: fuzzing::zone_table,
        random_len_max: 5 * 4096,
    }]
}

#[test]
fn seed_corpus_replays() {
    standin::replay_seeds(&targets(), 4);
}

/// Every seed is a device that opens, so mutations start from metadata that reaches
/// the deepest checks; a format change that breaks them shows here (regenerate with
/// `write_seed_corpus`).
#[test]
fn seeds_open() {
    for (file, data) in standin::corpus("zone_table") {
        let control = data[0];
        let lbs = if control & 2 == 2 { 512 } else { 4096 };
        let size = (data.len() - 1) as u64 + u64::from(control >> 2) * 4096;
        let mut dev = MemDevice::new(size, lbs).expect("memory device");
        dev.write_at(0, &data[1..]).expect("write image");
        if let Err(e) = ZoneEmu::open(dev) {
            panic!("zone_table/{file} does not open: {e}");
        }
    }
}

#[test]
fn random_and_mutated_inputs() {
    // Each input opens a device: a third of the inputs of the other targets.
    standin::random_and_mutated_share(&targets(), 3);
}

/// Formats `zones` zones of `config` on a memory device, lets `work` use it, and
/// returns the entry point's input for it: the control byte, then the metadata area
/// (the zones behind it are the zero blocks the control byte asks for; the data
/// written to them does not matter to the metadata).
fn seed(
    lbs: u32,
    config: ZoneEmuConfig,
    zones: u32,
    reseal: bool,
    work: impl FnOnce(&mut ZoneEmu<MemDevice>),
) -> Vec<u8> {
    let config = ZoneEmuConfig {
        zone_count_max: zones,
        ..config
    };
    let size = config.device_bytes_for(zones).expect("fits");
    let dev = MemDevice::new(size, lbs).expect("memory device");
    let mut emu = ZoneEmu::format(dev, &config).expect("format");
    work(&mut emu);
    let meta = emu.data_offset();
    let mut dev = emu.into_inner();
    let mut image = vec![0u8; meta as usize];
    dev.read_at(0, &mut image).expect("read metadata");
    let extra_blocks = (size - meta) / 4096;
    assert!(extra_blocks < 64, "zones must fit in the control byte");
    let control = u8::from(reseal) | if lbs == 512 { 2 } else { 0 } | (extra_blocks as u8) << 2;
    [vec![control], image].concat()
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    let small = ZoneEmuConfig::new(16 << 10);
    let limited = ZoneEmuConfig {
        zone_capacity: 6 << 10,
        max_open_zones: 2,
        max_active_zones: 3,
        ..ZoneEmuConfig::new(8 << 10)
    };
    let written = |emu: &mut ZoneEmu<MemDevice>| {
        let zone = emu.geometry().zone_size;
        let cap = emu.geometry().zone_capacity as usize;
        emu.write_at(0, &vec![1u8; cap]).expect("fill zone 0");
        emu.write_at(zone, &[2u8; 4096]).expect("zone 1");
        emu.manage(2, ZoneAction::Open).expect("open zone 2");
        emu.flush().expect("flush");
        emu.write_at(zone + 4096, &[3u8; 4096])
            .expect("zone 1 again");
        emu.flush().expect("flush");
    };
    standin::write_seeds(
        "zone_table",
        vec![
            ("v2-fresh", seed(4096, small.clone(), 4, true, |_| {})),
            (
                "v2-fresh-as-stored",
                seed(4096, small.clone(), 4, false, |_| {}),
            ),
            ("v2-written", seed(4096, small.clone(), 4, true, written)),
            ("v2-written-as-stored", seed(4096, small, 4, false, written)),
            (
                "v2-limits-512",
                seed(512, limited, 6, true, |emu| {
                    let zone = emu.geometry().zone_size;
                    emu.write_at(zone, &[4u8; 1024]).expect("zone 1");
                    emu.manage(3, ZoneAction::Finish).expect("finish zone 3");
                    emu.flush().expect("flush");
                }),
            ),
        ],
    );
}
