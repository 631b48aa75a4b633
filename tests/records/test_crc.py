"""CRC-32C and TFRecord's masking: known values and properties."""
import struct

from hypothesis import given
from hypothesis import strategies as st

from evenflow.records.tfrecord.crc import MASK_DELTA, crc32c, masked_crc32c, unmask_crc


# Check values of CRC-32C (Castagnoli); the last three are the iSCSI test vectors of RFC 3720 B.4.
KNOWN = [
    (b"", 0x00000000),
    (b"123456789", 0xE3069283),       # the standard "check" value of CRC-32C
    (bytes(32), 0x8A9136AA),          # 32 zero bytes
    (b"\xff" * 32, 0x62A8AB43),       # 32 0xFF bytes
    (bytes(range(32)), 0x46DD794E),   # ascending 0..31
]


def test_crc32c_known_values():
    for data, expected in KNOWN:
        assert crc32c(data) == expected, data


def test_masked_crc_known_value():
    # The mask: rotate right by 15, add 0xa282ead8 (mod 2**32).
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF
    # Bytes tf.io.TFRecordWriter wrote for the records b"" and b"hello" (TF 2.21):
    tf_bytes = bytes.fromhex("000000000000000029039807d8ea82a2"
                             "0500000000000000eab2043e68656c6c6fbb1f1c19")
    assert struct.pack("<I", masked_crc32c(struct.pack("<Q", 0))) == tf_bytes[8:12]
    assert struct.pack("<I", masked_crc32c(b"")) == tf_bytes[12:16]  # crc32c(b"") = 0, so just the delta
    assert struct.pack("<I", masked_crc32c(struct.pack("<Q", 5))) == tf_bytes[24:28]
    assert struct.pack("<I", masked_crc32c(b"hello")) == tf_bytes[33:37]


@given(st.binary(max_size=300))
def test_unmask_inverts_mask(data):
    assert unmask_crc(masked_crc32c(data)) == crc32c(data)
    assert 0 <= masked_crc32c(data) < 2 ** 32


def test_accepts_bytes_like():
    assert crc32c(bytearray(b"123456789")) == 0xE3069283
    assert crc32c(memoryview(b"123456789")) == 0xE3069283
