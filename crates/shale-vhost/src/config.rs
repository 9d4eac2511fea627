//! The device's options, feature bits and config space (`struct virtio_blk_config`).
//!
//! The config space is encoded by hand, field by field at the offsets of the
//! virtio 1.2 layout (5.2.4), little-endian, so no `repr(C)` struct is copied
//! out as bytes. Only the `writeback` byte is writable by the driver.

use std::time::Duration;

use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use virtio_bindings::bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

use crate::request::{RequestLimits, SECTOR_BYTES};

/// Queues per device at most: each gets a thread, chosen by a bit of a u64 mask.
pub const NUM_QUEUES_MAX: u16 = 64;
/// Queue size at most (the split ring's limit is 32768; more buys nothing here).
pub const QUEUE_SIZE_MAX: u16 = 1024;
/// Offset of the `writeback` byte in the config space.
pub const CONFIG_WRITEBACK_OFFSET: u32 = 32;
/// Bytes of the config space this device fills (through `write_zeroes_may_unmap`
/// and its padding); reads past it return zeroes.
pub const CONFIG_BYTES: usize = 60;

/// How the device looks to the guest and how much it lets one queue hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostOptions {
    /// Virtqueues (VIRTIO_BLK_F_MQ), each served by its own thread.
    pub num_queues: u16,
    /// Largest queue size the frontend may set (a power of two).
    pub queue_size_max: u16,
    /// Logical block size (`blk_size`, 512..=65536, a power of two): the guest
    /// does I/O in these units and requests are refused otherwise.
    pub block_bytes: u32,
    /// `seg_max`: data segments per request.
    pub seg_max: u32,
    /// `size_max`: bytes per segment. `seg_max * size_max` bounds one request's
    /// data, which the back-end copies into a buffer.
    pub size_max: u32,
    pub discard_sectors_max: u32,
    pub write_zeroes_sectors_max: u32,
    /// The serial GET_ID returns (at most 20 bytes; longer is cut).
    pub serial: String,
    /// The write cache's initial mode (the `writeback` config byte): with it
    /// the guest flushes; without it every write is FUA.
    pub writeback: bool,
    /// Requests popped from one queue and not yet completed, at most.
    pub queue_inflight_max: usize,
    /// Data bytes held by one queue's requests in flight, at most (one request
    /// is always let through).
    pub queue_inflight_bytes_max: u64,
    /// How long stopping a ring (GET_VRING_BASE) and ending a connection wait
    /// for requests in flight before giving up on them.
    pub drain_timeout: Duration,
}

impl Default for VhostOptions {
    fn default() -> Self {
        VhostOptions {
            num_queues: 1,
            queue_size_max: 256,
            block_bytes: 4096,
            seg_max: 126,
            size_max: 128 << 10,
            discard_sectors_max: 1 << 21,
            write_zeroes_sectors_max: 1 << 21,
            serial: "shale".into(),
            writeback: true,
            queue_inflight_max: 256,
            queue_inflight_bytes_max: 64 << 20,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Options that cannot describe a device.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OptionsError {
    #[error("num_queues {0} is not in 1..={NUM_QUEUES_MAX}")]
    NumQueues(u16),
    #[error("queue_size_max {0} is not a power of two in 1..={QUEUE_SIZE_MAX}")]
    QueueSize(u16),
    #[error("block_bytes {0} is not a power of two in 512..=65536")]
    BlockBytes(u32),
    #[error("seg_max {0} is not in 1..=1024")]
    SegMax(u32),
    #[error("size_max {size_max} is under the block size {block_bytes}")]
    SizeMax { size_max: u32, block_bytes: u32 },
    #[error("discard/write-zeroes sector limits must be a non-zero multiple of the block size")]
    SectorsMax,
    #[error("queue_inflight_max must be at least 1")]
    InflightMax,
    #[error("the target ({size_bytes} bytes) is smaller than one block")]
    TargetTooSmall { size_bytes: u64 },
}

impl VhostOptions {
    /// Checks the options against each other and the target's size.
    pub fn validate(&self, target_size_bytes: u64) -> Result<(), OptionsError> {
        if self.num_queues == 0 || self.num_queues > NUM_QUEUES_MAX {
            return Err(OptionsError::NumQueues(self.num_queues));
        }
        if !self.queue_size_max.is_power_of_two() || self.queue_size_max > QUEUE_SIZE_MAX {
            return Err(OptionsError::QueueSize(self.queue_size_max));
        }
        if !self.block_bytes.is_power_of_two() || !(512..=65536).contains(&self.block_bytes) {
            return Err(OptionsError::BlockBytes(self.block_bytes));
        }
        if self.seg_max == 0 || self.seg_max > 1024 {
            return Err(OptionsError::SegMax(self.seg_max));
        }
        if self.size_max < self.block_bytes {
            return Err(OptionsError::SizeMax {
                size_max: self.size_max,
                block_bytes: self.block_bytes,
            });
        }
        let block_sectors = self.block_bytes / SECTOR_BYTES as u32;
        for s in [self.discard_sectors_max, self.write_zeroes_sectors_max] {
            if s == 0 || s % block_sectors != 0 {
                return Err(OptionsError::SectorsMax);
            }
        }
        if self.queue_inflight_max == 0 {
            return Err(OptionsError::InflightMax);
        }
        if target_size_bytes < u64::from(self.block_bytes) {
            return Err(OptionsError::TargetTooSmall {
                size_bytes: target_size_bytes,
            });
        }
        Ok(())
    }

    /// The device's size: the target's, rounded down to whole blocks.
    pub fn capacity_bytes(&self, target_size_bytes: u64) -> u64 {
        let block = u64::from(self.block_bytes);
        target_size_bytes / block * block
    }

    /// The serial as GET_ID returns it: NUL-padded to 20 bytes.
    pub fn serial_bytes(&self) -> [u8; crate::request::ID_BYTES] {
        let mut id = [0u8; crate::request::ID_BYTES];
        let src = self.serial.as_bytes();
        let n = src.len().min(id.len());
        if let (Some(dst), Some(src)) = (id.get_mut(..n), src.get(..n)) {
            dst.copy_from_slice(src);
        }
        id
    }

    /// The virtio feature bits offered.
    pub fn features(&self, read_only: bool) -> u64 {
        let mut bits = [
            VIRTIO_F_VERSION_1,
            VIRTIO_RING_F_INDIRECT_DESC,
            VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_BLK_F_SIZE_MAX,
            VIRTIO_BLK_F_SEG_MAX,
            VIRTIO_BLK_F_BLK_SIZE,
            VIRTIO_BLK_F_TOPOLOGY,
            VIRTIO_BLK_F_FLUSH,
            VIRTIO_BLK_F_CONFIG_WCE,
            VIRTIO_BLK_F_MQ,
        ]
        .iter()
        .fold(0u64, |acc, b| acc | 1u64 << b);
        if read_only {
            bits |= 1 << VIRTIO_BLK_F_RO;
        } else {
            bits |= 1 << VIRTIO_BLK_F_DISCARD | 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        }
        bits | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    /// The vhost-user protocol features offered (REPLY_ACK is added by the library).
    pub fn protocol_features() -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    /// What requests are checked against, given the negotiated features.
    pub fn limits(&self, target_size_bytes: u64, read_only: bool, acked: u64) -> RequestLimits {
        RequestLimits {
            capacity_bytes: self.capacity_bytes(target_size_bytes),
            block_bytes: self.block_bytes,
            seg_max: self.seg_max,
            size_max: self.size_max,
            discard_sectors_max: self.discard_sectors_max,
            write_zeroes_sectors_max: self.write_zeroes_sectors_max,
            read_only,
            discard: !read_only && acked & (1 << VIRTIO_BLK_F_DISCARD) != 0,
            write_zeroes: !read_only && acked & (1 << VIRTIO_BLK_F_WRITE_ZEROES) != 0,
        }
    }

    /// `struct virtio_blk_config` with the current `writeback` byte.
    pub fn config_space(&self, target_size_bytes: u64, writeback: bool) -> [u8; CONFIG_BYTES] {
        let mut c = [0u8; CONFIG_BYTES];
        let mut put = |at: usize, bytes: &[u8]| {
            if let Some(dst) = c.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        };
        let block_sectors = self.block_bytes / SECTOR_BYTES as u32;
        put(
            0,
            &(self.capacity_bytes(target_size_bytes) / SECTOR_BYTES).to_le_bytes(),
        ); // capacity
        put(8, &self.size_max.to_le_bytes()); // size_max
        put(12, &self.seg_max.to_le_bytes()); // seg_max
                                              // 16..20: geometry, not offered.
        put(20, &self.block_bytes.to_le_bytes()); // blk_size
                                                  // topology: the physical block is the logical block (exponent 0), no
                                                  // alignment offset, minimum I/O one block, no optimal size.
        put(24, &[0]); // physical_block_exp
        put(25, &[0]); // alignment_offset
        put(26, &1u16.to_le_bytes()); // min_io_size, in blocks
        put(28, &0u32.to_le_bytes()); // opt_io_size, in blocks
        put(32, &[u8::from(writeback)]); // writeback
        put(34, &self.num_queues.to_le_bytes()); // num_queues
        put(36, &self.discard_sectors_max.to_le_bytes()); // max_discard_sectors
        put(40, &1u32.to_le_bytes()); // max_discard_seg
        put(44, &block_sectors.to_le_bytes()); // discard_sector_alignment
        put(48, &self.write_zeroes_sectors_max.to_le_bytes()); // max_write_zeroes_sectors
        put(52, &1u32.to_le_bytes()); // max_write_zeroes_seg
        put(56, &[1]); // write_zeroes_may_unmap
        c
    }
}

/// `offset..offset+size` of the config space, zero past what the device fills;
/// empty (the frontend's error) past the vhost-user config space's 4 KiB.
pub fn config_window(space: &[u8], offset: u32, size: u32) -> Vec<u8> {
    let Some(end) = offset.checked_add(size) else {
        return Vec::new();
    };
    if end > vhost::vhost_user::message::VHOST_USER_CONFIG_SIZE {
        return Vec::new();
    }
    (offset..end)
        .map(|i| space.get(i as usize).copied().unwrap_or(0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_space_fields() {
        let o = VhostOptions {
            num_queues: 4,
            ..VhostOptions::default()
        };
        let c = o.config_space((1 << 30) + 100, true);
        let u32_at = |at: usize| u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]);
        assert_eq!(
            u64::from_le_bytes(c[0..8].try_into().expect("8 bytes")),
            (1 << 30) / 512
        );
        assert_eq!(u32_at(12), 126);
        assert_eq!(u32_at(20), 4096);
        assert_eq!(c[24], 0);
        assert_eq!(u16::from_le_bytes([c[26], c[27]]), 1);
        assert_eq!(c[32], 1);
        assert_eq!(u16::from_le_bytes([c[34], c[35]]), 4);
        assert_eq!(u32_at(40), 1);
        assert_eq!(u32_at(44), 8);
        assert_eq!(u32_at(52), 1);
        assert_eq!(c[56], 1);
        assert_eq!(o.config_space(1 << 30, false)[32], 0);
    }

    #[test]
    fn config_window_pads_and_refuses() {
        let space = [7u8; 4];
        assert_eq!(config_window(&space, 2, 4), vec![7, 7, 0, 0]);
        assert!(config_window(&space, 4090, 16).is_empty());
        assert!(config_window(&space, u32::MAX, 2).is_empty());
    }

    #[test]
    fn features_follow_read_only() {
        let o = VhostOptions::default();
        let rw = o.features(false);
        let ro = o.features(true);
        assert_ne!(rw & 1 << VIRTIO_BLK_F_DISCARD, 0);
        assert_eq!(ro & 1 << VIRTIO_BLK_F_DISCARD, 0);
        assert_ne!(ro & 1 << VIRTIO_BLK_F_RO, 0);
        assert_ne!(rw & 1 << VIRTIO_F_VERSION_1, 0);
    }

    #[test]
    fn options_validate() {
        let o = VhostOptions::default();
        assert_eq!(o.validate(1 << 20), Ok(()));
        assert!(o.validate(100).is_err());
        let bad = VhostOptions {
            num_queues: 0,
            ..o.clone()
        };
        assert!(bad.validate(1 << 20).is_err());
        let bad = VhostOptions {
            queue_size_max: 100,
            ..o
        };
        assert!(bad.validate(1 << 20).is_err());
    }

    #[test]
    fn serial_is_padded_and_cut() {
        let o = VhostOptions {
            serial: "abcdefghijklmnopqrstuvwxyz".into(),
            ..VhostOptions::default()
        };
        assert_eq!(&o.serial_bytes(), b"abcdefghijklmnopqrst");
        let o = VhostOptions::default();
        assert_eq!(&o.serial_bytes()[..6], b"shale\0");
    }
}
