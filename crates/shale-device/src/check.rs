//! Argument checks shared by every device, so all of them reject the same bad
//! requests with the same errors before anything is touched.

use crate::{DeviceError, DeviceInfo, IoOpKind, SECTOR_SIZE};

/// Largest logical block size a device may report.
pub(crate) const LOGICAL_BLOCK_SIZE_MAX: u32 = 4096;

/// Validates a device geometry: `logical_block_size` is a power of two in
/// 512..=4096 and `size_bytes` is a non-zero multiple of it.
pub(crate) fn check_geometry(size_bytes: u64, logical_block_size: u32) -> Result<(), DeviceError> {
    if !logical_block_size.is_power_of_two()
        || (logical_block_size as usize) < SECTOR_SIZE
        || logical_block_size > LOGICAL_BLOCK_SIZE_MAX
    {
        return Err(DeviceError::InvalidGeometry {
            reason: format!(
                "logical block size {logical_block_size} is not a power of two in 512..=4096"
            ),
        });
    }
    if size_bytes == 0 {
        return Err(DeviceError::TooSmall {
            size: 0,
            min: u64::from(logical_block_size),
        });
    }
    if !size_bytes.is_multiple_of(u64::from(logical_block_size)) {
        return Err(DeviceError::InvalidGeometry {
            reason: format!(
                "size {size_bytes} is not a multiple of the logical block size {logical_block_size}"
            ),
        });
    }
    Ok(())
}

/// Validates the range of one I/O (read, write or discard) against the device:
/// zero length, then alignment, then bounds.
pub(crate) fn check_range(
    info: &DeviceInfo,
    op: IoOpKind,
    offset: u64,
    len: u64,
) -> Result<(), DeviceError> {
    if len == 0 {
        return Err(DeviceError::ZeroLength { op, offset });
    }
    let align = u64::from(info.logical_block_size);
    if !offset.is_multiple_of(align) || !len.is_multiple_of(align) {
        return Err(DeviceError::Misaligned {
            op,
            offset,
            len,
            align,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= info.size_bytes => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            op,
            offset,
            len,
            size: info.size_bytes,
        }),
    }
}

/// Validates an asynchronous read or write: the range, the buffer's alignment (an
/// `IoBuf` is always aligned, but the check is cheap and keeps the rule in one place)
/// and the device's largest single I/O.
pub(crate) fn check_async_io(
    info: &DeviceInfo,
    op: IoOpKind,
    offset: u64,
    buf_ptr: *const u8,
    len: usize,
) -> Result<(), DeviceError> {
    let len64 = len as u64;
    check_range(info, op, offset, len64)?;
    let align = u64::from(info.logical_block_size);
    if !(buf_ptr as usize as u64).is_multiple_of(align) {
        return Err(DeviceError::Misaligned {
            op,
            offset,
            len: len64,
            align,
        });
    }
    if len64 > u64::from(info.max_io_bytes) {
        return Err(DeviceError::TooLarge {
            op,
            offset,
            len: len64,
            max: u64::from(info.max_io_bytes),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> DeviceInfo {
        DeviceInfo {
            name: "t".into(),
            size_bytes: 1 << 20,
            logical_block_size: 4096,
            max_io_bytes: 1 << 16,
            queue_depth: 8,
        }
    }

    #[test]
    fn geometry_rules() {
        assert!(check_geometry(4096, 4096).is_ok());
        assert!(check_geometry(512, 512).is_ok());
        assert!(matches!(
            check_geometry(0, 512),
            Err(DeviceError::TooSmall { size: 0, .. })
        ));
        assert!(matches!(
            check_geometry(4096 + 512, 4096),
            Err(DeviceError::InvalidGeometry { .. })
        ));
        for lbs in [0u32, 256, 1000, 8192, 3 * 512] {
            assert!(matches!(
                check_geometry(1 << 20, lbs),
                Err(DeviceError::InvalidGeometry { .. })
            ));
        }
    }

    #[test]
    fn range_rules_in_order() {
        let i = info();
        assert!(matches!(
            check_range(&i, IoOpKind::Read, 3, 0),
            Err(DeviceError::ZeroLength { offset: 3, .. })
        ));
        assert!(matches!(
            check_range(&i, IoOpKind::Read, 512, 4096),
            Err(DeviceError::Misaligned { align: 4096, .. })
        ));
        assert!(matches!(
            check_range(&i, IoOpKind::Write, (1 << 20) - 4096, 8192),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            check_range(&i, IoOpKind::Write, u64::MAX - 4095, 4096),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(check_range(&i, IoOpKind::Write, (1 << 20) - 4096, 4096).is_ok());
        let b = crate::IoBuf::zeroed(1 << 17);
        assert!(matches!(
            check_async_io(&i, IoOpKind::Write, 0, b.as_ptr(), b.len()),
            Err(DeviceError::TooLarge { .. })
        ));
    }
}
