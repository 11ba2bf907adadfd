"""The records of a TensorBoard event file, read in large blocks, with their checksums checked.

An event file is a TFRecord file: each record is ``uint64 length``, ``uint32 masked
crc32c(length)``, ``length`` bytes of a serialized ``Event`` protocol buffer and ``uint32 masked
crc32c(data)`` (little-endian; TensorFlow's ``core/lib/io/record_writer.cc``). The tensorboard
package reads them with ``PyRecordReader`` when TensorFlow is not installed, which computes
CRC-32C in Python, a table lookup per byte, and reads each record in four small reads: far
slower than an import needs (BENCHMARKS.md, "imports"). This reads 1 MiB blocks and checks the
same checksums with ``google-crc32c`` (C). The records' contents are parsed by the tensorboard
package's own ``Event`` message (:mod:`.events`).

A record cut off at the end of a file (a writer still writing it) ends the reading there; the
offset after the last whole record is where a later import continues.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import google_crc32c

__all__ = ["DamagedRecord", "read_records"]

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_BLOCK = 1 << 20
_MASK_DELTA = 0xA282EAD8


class DamagedRecord(ValueError):
    """A record whose checksum does not match: the file is damaged from ``offset`` on."""

    def __init__(self, path: Path, offset: int, what: str) -> None:
        super().__init__(f"{path}: damaged record at byte {offset} ({what} checksum mismatch)")
        self.path = path
        self.offset = offset


def _masked_crc(data: bytes) -> int:
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(path: Path, start: int = 0) -> Iterator[tuple[list[bytes], list[int]]]:
    """The whole records from byte ``start`` on (a record boundary), a block at a time: each
    block's records' data, and the file offset just after each of them.

    The length's own checksum is checked only for a record that reaches past the block read
    (it decides how much more to read); a record within the block has its length checked by
    the data's checksum, which covers the bytes the length delimits.

    Raises:
        DamagedRecord: a checksum does not match (every record before it was yielded).
        OSError: the file cannot be read.
    """
    unpack_header = _HEADER.unpack_from
    unpack_crc = _CRC.unpack_from
    crc32c = google_crc32c.value
    with path.open("rb") as f:
        f.seek(start)
        buf = f.read(_BLOCK)
        base = start  # the file offset of buf[0]
        pos = 0
        while True:
            records: list[bytes] = []
            ends: list[int] = []
            size = len(buf)
            damage: DamagedRecord | None = None
            while size - pos >= 12:
                length, length_crc = unpack_header(buf, pos)
                end = pos + 16 + length
                if end > size:
                    if _masked_crc(buf[pos:pos + 8]) != length_crc:
                        # A torn length would ask for an absurd read: refuse it.
                        damage = DamagedRecord(path, base + pos, "length")
                    break
                data = buf[pos + 12:end - 4]
                crc = crc32c(data)
                if ((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
                        != unpack_crc(buf, end - 4)[0]):
                    damage = DamagedRecord(path, base + pos, "data")
                    break
                records.append(data)
                ends.append(base + end)
                pos = end
            if records:
                yield records, ends
            if damage is not None:
                raise damage
            need = 12 if size - pos < 12 else 16 + unpack_header(buf, pos)[0]
            more = f.read(max(_BLOCK, need - (size - pos)))
            if not more:
                return  # the end of the file, or a record still being written
            buf = buf[pos:] + more
            base += pos
            pos = 0
