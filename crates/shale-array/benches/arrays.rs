//! Figures of the array layer alone, side by side in one run:
//!
//! - `encode`: the array layer's CPU work per stripe, without devices (the data
//!   units copied into member buffers, and the parity), per 4 KiB user block, for each
//!   layout (median of 2000 stripes);
//! - `rebuild`: an unthrottled rebuild of one member of a 4+1 array whose zones are
//!   full of data, against the same array half full (rebuild time follows live data),
//!   over memory-backed members: seconds, GiB/s of the new member's bytes, and the
//!   half/full time ratio. Medians of `--repeat` (default 3).
//!
//! ```text
//! cargo bench -p shale-array --bench arrays -- [--repeat 3] [--zones 256]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use shale_array::{Redundancy, ZoneArray, LABEL_ZONES, STRIPE_BYTES_MAX};
use shale_device::{IoBuf, MemDevice, ZoneEmu, ZoneEmuConfig, ZoneOp, ZoneRequest, ZonedDevice};

fn member(zone: u64, zones: u32) -> ZoneEmu<MemDevice> {
    let cfg = ZoneEmuConfig::new(zone);
    let bytes = cfg.device_bytes_for(zones + LABEL_ZONES).unwrap();
    ZoneEmu::format(MemDevice::new(bytes, 4096).unwrap(), &cfg).unwrap()
}

fn array(r: Redundancy, zones: u32) -> ZoneArray<ZoneEmu<MemDevice>> {
    let (k, m) = r
        .shards(match r {
            Redundancy::Parity { k, m } => usize::from(k + m),
            _ => 2,
        })
        .unwrap();
    let unit = STRIPE_BYTES_MAX / u64::from(k);
    // Member zones of 16 rows.
    let zone = 16 * unit;
    let members = (0..k + m)
        .map(|i| (Some(member(zone, zones)), format!("m{i}")))
        .collect();
    ZoneArray::new(members, r, unit).unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Writes whole zones of stripes into the first `fill` zones.
fn fill(a: &mut ZoneArray<ZoneEmu<MemDevice>>, fill: u32) {
    let g = a.geometry().clone();
    let stripe = vec![0x5au8; g.write_unit as usize];
    for z in 0..fill {
        let start = g.zone_start(z);
        let mut off = 0;
        while off < g.zone_capacity {
            a.submit(ZoneRequest {
                tag: 0,
                op: ZoneOp::Write {
                    offset: start + off,
                    buf: IoBuf::from_slice(&stripe),
                    fua: false,
                },
            });
            let mut out = Vec::new();
            a.poll(&mut out, 1).unwrap();
            off += stripe.len() as u64;
        }
    }
    a.flush().unwrap();
}

/// The array layer's CPU work for one stripe, without devices: the K data units
/// copied out of the engine's group buffer into member buffers, and the parity.
fn encode(r: Redundancy) -> f64 {
    let n = match r {
        Redundancy::Parity { k, m } => usize::from(k + m),
        _ => 2,
    };
    let (k, m) = r.shards(n).unwrap();
    let (k, m) = (k as usize, m as usize);
    let codec = shale_array::codec::for_redundancy(r, n).unwrap();
    let unit = STRIPE_BYTES_MAX as usize / k;
    let stripe: Vec<u8> = (0..STRIPE_BYTES_MAX as usize).map(|i| i as u8).collect();
    let mut shards = vec![vec![0u8; unit]; k + m];
    let mut times = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        for (d, s) in shards[..k].iter_mut().enumerate() {
            s.copy_from_slice(&stripe[d * unit..(d + 1) * unit]);
        }
        let (data, parity) = shards.split_at_mut(k);
        let srcs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut dsts: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(&srcs, &mut dsts).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    std::hint::black_box(&shards);
    // Per 4 KiB of user data.
    median(times) / (STRIPE_BYTES_MAX as f64 / 4096.0)
}

fn rebuild(zones: u32, fill_zones: u32) -> (f64, f64) {
    let mut a = array(Redundancy::Parity { k: 4, m: 1 }, zones);
    fill(&mut a, fill_zones);
    a.fail_member(2, "bench").unwrap();
    let new = member(a.layout().unit * 16, zones);
    a.replace("2", new, "new".into()).unwrap();
    let t = Instant::now();
    while a.rebuilding() {
        a.maintain();
    }
    let secs = t.elapsed().as_secs_f64();
    let bytes = a.members()[2].counters.bytes_written as f64;
    (secs, bytes / secs / f64::from(1u32 << 30))
}

fn main() {
    let mut repeat = 3;
    let mut zones = 256u32;
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        match f.as_str() {
            "--repeat" => repeat = it.next().and_then(|v| v.parse().ok()).unwrap_or(3),
            "--zones" => zones = it.next().and_then(|v| v.parse().ok()).unwrap_or(256),
            _ => {}
        }
    }
    for r in ["4+1", "4+2", "8+3", "mirror"] {
        let red: Redundancy = r.parse().unwrap();
        let v: Vec<f64> = (0..repeat).map(|_| encode(red)).collect();
        println!(
            "encode {r:<6} {:>6.3} µs per 4 KiB user block (copy into member buffers and parity of one 512 KiB stripe, median)",
            median(v)
        );
    }
    let mut full = Vec::new();
    let mut half = Vec::new();
    let mut rate = Vec::new();
    for _ in 0..repeat {
        let (f, g) = rebuild(zones, zones);
        let (h, _) = rebuild(zones, zones / 2);
        full.push(f);
        half.push(h);
        rate.push(g);
    }
    let (f, h) = (median(full), median(half));
    println!(
        "rebuild 4+1, {zones} zones of 2 MiB per member: full {f:.3} s, half full {h:.3} s, half/full {:.2}, unthrottled {:.2} GiB/s written to the new member",
        h / f,
        median(rate)
    );
}
