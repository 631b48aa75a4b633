"""The byte layout of one TFRecord frame, shared by the writer, the scanner, the index and the reader.

A record takes ``length + 16`` bytes::

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

all little-endian. The ``.idx`` sidecar stores each record's framed size, so it needs these
sizes as much as the code that reads and writes the frames does.
"""
from __future__ import annotations

import struct

HEADER_BYTES = 12  # uint64 length + uint32 masked crc of it
FOOTER_BYTES = 4   # uint32 masked crc of the data
FRAME_BYTES = HEADER_BYTES + FOOTER_BYTES

LENGTH = struct.Struct("<Q")  # the length field, whose masked CRC follows it
