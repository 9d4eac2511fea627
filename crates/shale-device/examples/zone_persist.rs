//! What one zone-table persist costs on a large emulated drive: format a sparse
//! file as zones, then time zone writes each followed by a flush, and resets, with
//! the bytes the process wrote to the file for them (`wchar` of /proc/self/io: the
//! table writes are synchronous `pwrite`s; the zone data goes through the other
//! engine and is not counted there).
//!
//! `cargo run --release -p shale-device --example zone_persist -- DIR [TiB] [zone MiB] [ops]`
//! (defaults 16 TiB, 64 MiB zones, 200 of each). DIR should be tmpfs (/dev/shm): an
//! ext4 file stops at 16 TiB, and the file stays sparse.

use std::time::Instant;

use shale_device::{FileDevice, ZoneEmu, ZoneEmuConfig, ZonedDevice};

fn wchar() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = std::path::PathBuf::from(
        args.first()
            .ok_or("usage: zone_persist DIR [TiB] [zone MiB] [ops]")?,
    );
    let tib: u64 = args.get(1).map_or(Ok(16), |a| a.parse())?;
    let zone_mib: u64 = args.get(2).map_or(Ok(64), |a| a.parse())?;
    let ops: u32 = args.get(3).map_or(Ok(200), |a| a.parse())?;
    let path = dir.join("zone-persist.img");
    FileDevice::create_sparse(&path, tib << 40)?;
    let config = ZoneEmuConfig::new(zone_mib << 20);
    let t = Instant::now();
    let mut emu = ZoneEmu::format(FileDevice::open(&path)?, &config)?;
    let format_ms = t.elapsed().as_secs_f64() * 1e3;
    let zones = emu.geometry().zone_count;
    let zone = emu.geometry().zone_size;
    println!(
        "{tib} TiB, {zones} zones of {zone_mib} MiB: format {format_ms:.1} ms, metadata area {} KiB",
        emu.data_offset() >> 10
    );
    let data = vec![7u8; 4096];
    let step = (zones / ops.max(1)).max(1);
    let targets: Vec<u32> = (0..ops).map(|i| (i * step) % zones).collect();
    let (w0, t0) = (wchar(), Instant::now());
    for &z in &targets {
        emu.write_at(u64::from(z) * zone, &data)?;
        emu.flush()?;
    }
    let (flush_us, flush_bytes) = (t0.elapsed().as_secs_f64() * 1e6, wchar() - w0);
    let (w0, t0) = (wchar(), Instant::now());
    for &z in &targets {
        emu.reset_zone(z)?;
    }
    let (reset_us, reset_bytes) = (t0.elapsed().as_secs_f64() * 1e6, wchar() - w0);
    let n = f64::from(ops);
    println!(
        "write 4 KiB + flush: {:.1} µs each, {:.1} KiB written each (the 4 KiB of data included)",
        flush_us / n,
        flush_bytes as f64 / n / 1024.0
    );
    println!(
        "reset: {:.1} µs each, {:.1} KiB written each",
        reset_us / n,
        reset_bytes as f64 / n / 1024.0
    );
    drop(emu);
    std::fs::remove_file(&path)?;
    Ok(())
}
