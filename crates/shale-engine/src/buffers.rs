//! A pool of aligned I/O buffers by size in blocks, so steady-state device I/O does
//! not allocate or zero memory. Buffers come back from the device in completions.
//!
//! Invariant: a pooled buffer's contents are garbage; takers overwrite every byte they
//! hand to a device (writes) or let the device fill it (reads).

use shale_device::IoBuf;
use shale_format::{BLOCK_SIZE, GROUP_BLOCKS};

/// Bytes kept per size class (small sizes may have many buffers in flight at once).
const PER_SIZE_BYTES_MAX: usize = 16 << 20;

#[derive(Debug, Default)]
pub(crate) struct BufPool {
    by_blocks: Vec<Vec<IoBuf>>,
    /// Buffers allocated because the pool had none of the size.
    pub allocs: u64,
}

impl BufPool {
    pub fn new() -> BufPool {
        BufPool {
            by_blocks: (0..=GROUP_BLOCKS).map(|_| Vec::new()).collect(),
            allocs: 0,
        }
    }

    /// A buffer of `blocks` blocks with unspecified contents.
    pub fn take(&mut self, blocks: usize) -> IoBuf {
        match self.by_blocks.get_mut(blocks).and_then(Vec::pop) {
            Some(b) => b,
            None => {
                self.allocs += 1;
                IoBuf::zeroed(blocks * BLOCK_SIZE)
            }
        }
    }

    /// Bytes held in the pool (idle buffers).
    pub fn pooled_bytes(&self) -> u64 {
        self.by_blocks
            .iter()
            .map(|v| v.iter().map(|b| b.len() as u64).sum::<u64>())
            .sum()
    }

    pub fn give(&mut self, buf: IoBuf) {
        if !buf.len().is_multiple_of(BLOCK_SIZE) {
            return;
        }
        if let Some(v) = self.by_blocks.get_mut(buf.len() / BLOCK_SIZE) {
            if v.len() < (PER_SIZE_BYTES_MAX / buf.len().max(1)).max(8) {
                v.push(buf);
            }
        }
    }
}
