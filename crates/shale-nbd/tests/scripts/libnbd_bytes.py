# Byte-granular I/O through libnbd in its default strict mode, every byte checked
# against a model of the export. Run by nbdsh, which provides the connected handle
# `h`: nbdsh -u URI -c "exec(open('libnbd_bytes.py').read())". Shared by the shale-nbd test
# against MemBackend and the shale-cli test against the real daemon. With
# LIBNBD_BYTES_MODEL set, the final model is written to that file, so the caller
# can compare it with what the backend holds (or holds after a restart).
#
# STRICT_ALIGN makes libnbd refuse, before sending, any request not aligned to
# the advertised minimum block size; a server advertising 512 would make every
# sub-sector request below fail on the client side.

import os
import random

import nbd

assert h.get_strict_mode() & nbd.STRICT_ALIGN, h.get_strict_mode()
assert h.get_block_size(nbd.SIZE_MINIMUM) == 1, h.get_block_size(nbd.SIZE_MINIMUM)
assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096, h.get_block_size(nbd.SIZE_PREFERRED)
assert h.can_trim() and h.can_zero() and h.can_fua() and h.can_flush()

SIZE = h.get_size()
BS = 4096
CHUNK = 1 << 20  # below any payload maximum Shale advertises
assert SIZE >= 1 << 20, SIZE
rng = random.Random(20240601)
ops = 0
model = bytearray()


def check(offset, count, what):
    """Reads [offset, offset+count) and compares it with the model."""
    global ops
    ops += 1
    got = h.pread(count, offset)
    want = bytes(model[offset:offset + count])
    if got != want:
        bad = next(i for i in range(count) if got[i] != want[i])
        raise AssertionError(
            f"{what}: byte {offset + bad} reads {got[bad]:#04x}, model has {want[bad]:#04x}"
            f" (read of {count} at {offset})")


def check_around(offset, count, what):
    """The bytes just outside [offset, offset+count), up to a block each side."""
    lo = max(0, offset - BS)
    hi = min(SIZE, offset + count + BS)
    if lo < offset:
        check(lo, offset - lo, what + ": bytes before")
    if offset + count < hi:
        check(offset + count, hi - offset - count, what + ": bytes after")


def write(offset, data, flags=0):
    global ops
    ops += 1
    h.pwrite(data, offset, flags)
    model[offset:offset + len(data)] = data
    check(offset, len(data), f"write of {len(data)} at {offset}")
    check_around(offset, len(data), f"write of {len(data)} at {offset}")


def zero(offset, count, flags=0):
    """Write-zeroes is exact: the range reads zero, nothing else changes."""
    global ops
    ops += 1
    h.zero(count, offset, flags)
    model[offset:offset + count] = bytes(count)
    check(offset, count, f"write-zeroes of {count} at {offset}")
    check_around(offset, count, f"write-zeroes of {count} at {offset}")


def trim(offset, count, flags=0):
    """Trim is advisory (partial blocks may keep their data): only the bytes
    outside the range are known; the range becomes whatever it reads now."""
    global ops
    ops += 1
    h.trim(count, offset, flags)
    check_around(offset, count, f"trim of {count} at {offset}")
    model[offset:offset + count] = h.pread(count, offset)


def verify_all(what):
    for off in range(0, SIZE, CHUNK):
        check(off, min(CHUNK, SIZE - off), what)


def main():
    global model
    # Start from non-zero data everywhere, so a read-modify-write that loses the
    # rest of its block cannot hide behind zeros.
    model = bytearray(rng.randbytes(SIZE))
    for off in range(0, SIZE, CHUNK):
        h.pwrite(bytes(model[off:off + CHUNK]), off)
    verify_all("initial fill")

    # 1-byte writes and reads at the edges of sectors, blocks and the export.
    for off in [0, 1, 511, 512, 4095, 4096 + 7, 65535, SIZE - 4096 - 1, SIZE - 2, SIZE - 1]:
        write(off, bytes([rng.randrange(256)]))
        check(off, 1, f"1-byte read at {off}")
    write(SIZE - 1, b"\xa5", nbd.CMD_FLAG_FUA)

    # Unaligned multi-byte writes and reads across 4 KiB block boundaries.
    for off, count in [(BS - 5, 10), (2 * BS - 1, 2), (3 * BS + 100, BS), (5 * BS - 1000, 5000),
                       (9 * BS + 4000, 3 * BS + 17), (64 * BS + 1, 64 * BS - 2),
                       (SIZE - BS - 3, BS + 3)]:
        write(off, rng.randbytes(count))
        lo, hi = max(0, off - 1), min(SIZE, off + count + 1)
        check(lo, hi - lo, f"read across {off}+{count}")
    for off, count in [(1, 4095), (4095, 2), (4097, 8191), (123457, 70001), (SIZE - 5000, 5000)]:
        check(off, count, f"unaligned read {off}+{count}")

    # Write-zeroes inside one block, across blocks, with FUA, NO_HOLE, at the tail.
    zero(20 * BS + 100, 50)
    zero(21 * BS + 3000, 2 * BS + 200)
    zero(25 * BS - 1, 2, nbd.CMD_FLAG_FUA)
    zero(30 * BS + 7, 5 * BS, nbd.CMD_FLAG_NO_HOLE)
    zero(SIZE - 777, 777)

    # Trim inside one block, and unaligned across whole blocks, then rewrite part of it.
    trim(40 * BS + 10, 100)
    trim(41 * BS + 1, 3 * BS)
    write(42 * BS - 3, rng.randbytes(7))
    trim(SIZE - 3 * BS - 11, 3 * BS + 11)

    # Seeded random mix of small unaligned operations.
    for _ in range(300):
        kind = rng.random()
        count = rng.randrange(1, 3 * BS)
        off = rng.randrange(0, SIZE - count + 1)
        if kind < 0.5:
            write(off, rng.randbytes(count))
        elif kind < 0.7:
            zero(off, count)
        elif kind < 0.8:
            trim(off, count)
        else:
            check(off, count, f"random read {off}+{count}")
        if rng.random() < 0.05:
            h.flush()

    h.flush()
    verify_all("final read-back")
    assert h.get_strict_mode() & nbd.STRICT_ALIGN
    if os.environ.get("LIBNBD_BYTES_MODEL"):
        with open(os.environ["LIBNBD_BYTES_MODEL"], "wb") as f:
            f.write(model)
    print(f"libnbd-bytes: ok ops={ops} size={SIZE}")


# nbdsh reports a libnbd error without saying where; an assertion error carries the
# traceback (with LIBNBD_DEBUG the whole wire log would come too).
try:
    main()
except nbd.Error as e:
    raise AssertionError(f"libnbd: {e.string}") from e
