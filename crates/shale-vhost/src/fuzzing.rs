//! The entry point shared by the cargo-fuzz target (`fuzz/fuzz_targets/vhost_request.rs`)
//! and the stable stand-in (`tests/fuzz_corpus.rs`): arbitrary bytes become a
//! guest's memory and descriptor table, and every chain the guest offers is
//! parsed and completed the way the back-end does it. It panics only on a
//! broken invariant of the parser.
//!
//! Input layout:
//! - byte 0 selects the device: bit 0 read-only, bit 1 DISCARD negotiated,
//!   bit 2 WRITE_ZEROES negotiated, bit 3 512-byte blocks (else 4096),
//!   bits 4-5 the capacity (0, one block, 1 MiB, the largest);
//! - byte 1: how many chains the avail ring offers (low nibble, at most 15);
//! - the rest is guest memory from address 0 (a 64 KiB region; a second 4 KiB
//!   region sits at [`HIGH_REGION`], past a hole). The descriptor table (16
//!   entries) is at 0; the avail ring's head entries are taken from the bytes
//!   at [`HEADS_AT`], reduced modulo 20 so some point past the table.

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, Permissions};

use crate::request::{
    gather, parse, scatter, write_status, Op, RequestLimits, ID_BYTES, STATUS_OK,
};

/// Queue size of the fuzzed ring.
pub const QUEUE_SIZE: u16 = 16;
/// The first region: descriptor table at 0, rings at the addresses below.
pub const LOW_REGION_BYTES: usize = 64 << 10;
pub const HIGH_REGION: u64 = 0x2_0000;
pub const HIGH_REGION_BYTES: usize = 4 << 10;
pub const AVAIL_RING: u64 = 0x8000;
pub const USED_RING: u64 = 0x9000;
/// Where the avail ring's head indices are read from (in guest memory).
pub const HEADS_AT: u64 = 0x100;
/// Offset of guest memory in the input.
pub const MEMORY_AT: usize = 2;

/// The device a selector byte describes.
pub fn limits_for(sel: u8) -> RequestLimits {
    let block_bytes = if sel & 8 != 0 { 512 } else { 4096 };
    let capacity_bytes = match (sel >> 4) & 3 {
        0 => 0,
        1 => u64::from(block_bytes),
        2 => 1 << 20,
        _ => u64::MAX / u64::from(block_bytes) * u64::from(block_bytes),
    };
    RequestLimits {
        capacity_bytes,
        block_bytes,
        seg_max: 4,
        size_max: 16 << 10,
        discard_sectors_max: 1 << 12,
        write_zeroes_sectors_max: 1 << 12,
        read_only: sel & 1 != 0,
        discard: sel & 2 != 0,
        write_zeroes: sel & 4 != 0,
    }
}

/// Parses and completes every chain the input's avail ring offers.
pub fn request(data: &[u8]) {
    let _ = outcomes(data);
}

/// What became of one chain: the request's name, or the status it was refused
/// with (`None`: no status byte to write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Parsed(&'static str),
    Refused(Option<u8>),
}

/// [`request`], returning each chain's head and outcome (for the seed tests).
pub fn outcomes(data: &[u8]) -> Vec<(u16, Outcome)> {
    let mut out = Vec::new();
    let Some((&sel, rest)) = data.split_first() else {
        return out;
    };
    let Some((&count, image)) = rest.split_first() else {
        return out;
    };
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), LOW_REGION_BYTES),
        (GuestAddress(HIGH_REGION), HIGH_REGION_BYTES),
    ]) else {
        return out;
    };
    let image = image.get(..LOW_REGION_BYTES).unwrap_or(image);
    if mem.write_slice(image, GuestAddress(0)).is_err() {
        return out;
    }
    let count = u16::from(count & 0x0f);
    // The avail ring: flags 0, idx = count, then the heads.
    let mut avail = vec![0u8; 4 + 2 * usize::from(QUEUE_SIZE)];
    avail[2..4].copy_from_slice(&count.to_le_bytes());
    for i in 0..usize::from(QUEUE_SIZE) {
        let mut b = [0u8; 1];
        let _ = mem.read_slice(&mut b, GuestAddress(HEADS_AT + i as u64));
        let head = u16::from(b[0]) % (QUEUE_SIZE + 4);
        avail[4 + 2 * i..6 + 2 * i].copy_from_slice(&head.to_le_bytes());
    }
    if mem.write_slice(&avail, GuestAddress(AVAIL_RING)).is_err() {
        return out;
    }
    let Ok(mut queue) = Queue::new(QUEUE_SIZE) else {
        return out;
    };
    let placed = queue.try_set_desc_table_address(GuestAddress(0)).is_ok()
        && queue
            .try_set_avail_ring_address(GuestAddress(AVAIL_RING))
            .is_ok()
        && queue
            .try_set_used_ring_address(GuestAddress(USED_RING))
            .is_ok();
    assert!(placed, "the fuzz ring's addresses are aligned");
    queue.set_ready(true);
    let limits = limits_for(sel);
    let mut chains = Vec::new();
    if let Ok(iter) = queue.iter(&mem) {
        chains.extend(iter);
    }
    for chain in chains {
        let head = chain.head_index();
        let (used_len, outcome) = run_one(&mem, head, chain, &limits);
        // Out-of-table heads are refused by the queue; that is the point.
        let _ = queue.add_used(&mem, head, used_len);
        out.push((head, outcome));
    }
    out
}

fn run_one<I>(
    mem: &GuestMemoryMmap<()>,
    head: u16,
    chain: I,
    limits: &RequestLimits,
) -> (u32, Outcome)
where
    I: IntoIterator<Item = virtio_queue::desc::split::Descriptor>,
{
    match parse(head, chain, mem, limits) {
        Err(rej) => {
            if let Some(s) = rej.status {
                assert!(
                    mem.check_range(s, 1, Permissions::Write),
                    "status outside memory"
                );
            }
            let written = rej.status.is_some_and(|s| write_status(mem, s, rej.code));
            let code = rej.status.map(|_| rej.code);
            (u32::from(written), Outcome::Refused(code))
        }
        Ok(req) => {
            assert!(
                mem.check_range(req.status, 1, Permissions::Write),
                "status outside memory"
            );
            let data_len = check_op(mem, &req.op, limits);
            let name = match req.op {
                Op::Read { .. } => "read",
                Op::Write { .. } => "write",
                Op::Flush => "flush",
                Op::GetId { .. } => "get-id",
                Op::Discard { .. } => "discard",
                Op::WriteZeroes { .. } => "write-zeroes",
            };
            let used = u32::from(write_status(mem, req.status, STATUS_OK)) + data_len;
            (used, Outcome::Parsed(name))
        }
    }
}

/// Checks a parsed request against the limits and moves its data the way the
/// back-end would; returns the bytes written to the guest before the status.
fn check_op(mem: &GuestMemoryMmap<()>, op: &Op, limits: &RequestLimits) -> u32 {
    let block = u64::from(limits.block_bytes);
    let in_device = |offset: u64, len: u64| {
        assert_eq!(offset % block, 0, "unaligned offset");
        assert_eq!(len % block, 0, "unaligned length");
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|e| e <= limits.capacity_bytes),
            "range outside the device"
        );
    };
    let segments_ok = |segments: &[crate::request::Segment], len: u64, perm| {
        assert!(
            segments.len() <= limits.seg_max as usize,
            "too many segments"
        );
        let total: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
        assert_eq!(total, len, "segments do not add up");
        for s in segments {
            assert!(
                mem.check_range(s.addr, s.len as usize, perm),
                "segment outside memory"
            );
        }
    };
    match op {
        Op::Read {
            offset,
            len,
            segments,
        } => {
            in_device(*offset, *len);
            assert!(*len <= limits.data_bytes_max());
            segments_ok(segments, *len, Permissions::Write);
            let data = vec![0xa5; *len as usize];
            assert!(scatter(mem, segments, &data).is_ok(), "read data scatter");
            *len as u32
        }
        Op::Write {
            offset,
            len,
            segments,
        } => {
            assert!(!limits.read_only, "a write on a read-only device");
            in_device(*offset, *len);
            assert!(*len <= limits.data_bytes_max());
            segments_ok(segments, *len, Permissions::Read);
            let mut data = vec![0; *len as usize];
            assert!(
                gather(mem, segments, &mut data).is_ok(),
                "write data gather"
            );
            0
        }
        Op::Flush => 0,
        Op::GetId { segments } => {
            let total: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
            assert!(total >= 1 && total <= ID_BYTES as u64);
            assert!(scatter(mem, segments, &[b's'; ID_BYTES]).is_ok());
            total as u32
        }
        Op::Discard { offset, len } => {
            assert!(!limits.read_only && limits.discard);
            in_device(*offset, *len);
            assert!(*len <= u64::from(limits.discard_sectors_max) * 512);
            0
        }
        Op::WriteZeroes { offset, len, .. } => {
            assert!(!limits.read_only && limits.write_zeroes);
            in_device(*offset, *len);
            assert!(*len <= u64::from(limits.write_zeroes_sectors_max) * 512);
            0
        }
    }
}

/// Builds an input: `descriptors` become the table (index order), `heads` the
/// avail ring, and `(address, bytes)` pairs are placed in guest memory. For the
/// seed corpus and the tests.
pub fn build_input(
    sel: u8,
    descriptors: &[(u64, u32, u16, u16)],
    heads: &[u16],
    placed: &[(u64, Vec<u8>)],
) -> Vec<u8> {
    let mut image = vec![0u8; 0x1000];
    for (i, &(addr, len, flags, next)) in descriptors.iter().enumerate().take(16) {
        let at = i * 16;
        image[at..at + 8].copy_from_slice(&addr.to_le_bytes());
        image[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
        image[at + 12..at + 14].copy_from_slice(&flags.to_le_bytes());
        image[at + 14..at + 16].copy_from_slice(&next.to_le_bytes());
    }
    for (i, &h) in heads.iter().enumerate().take(16) {
        image[HEADS_AT as usize + i] = h as u8;
    }
    for (addr, bytes) in placed {
        let at = *addr as usize;
        if at + bytes.len() > image.len() {
            image.resize((at + bytes.len()).min(LOW_REGION_BYTES), 0);
        }
        if let Some(dst) = image.get_mut(at..at + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }
    let mut out = vec![sel, heads.len().min(15) as u8];
    out.extend_from_slice(&image);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_input_never_panics(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
            request(&data);
        }

        /// Random descriptors over a memory image that holds plausible headers.
        #[test]
        fn arbitrary_chains_never_panic(
            sel in any::<u8>(),
            descs in proptest::collection::vec(
                (prop_oneof![Just(0x1000u64), Just(0x1010), Just(0x2000), Just(0xfff0), Just(0x1_fff8), Just(u64::MAX - 4), any::<u64>()],
                 prop_oneof![Just(1u32), Just(16), Just(512), Just(4096), Just(8192), any::<u32>()],
                 0u16..8, 0u16..20),
                1..16),
            heads in proptest::collection::vec(0u16..20, 1..15),
            kind in 0u32..16,
            sector in prop_oneof![Just(0u64), Just(8), Just(u64::MAX / 512), any::<u64>()],
        ) {
            let mut header = kind.to_le_bytes().to_vec();
            header.extend_from_slice(&[0; 4]);
            header.extend_from_slice(&sector.to_le_bytes());
            let input = build_input(sel, &descs, &heads, &[(0x1000, header)]);
            request(&input);
        }
    }
}
