"""CRC-32C and the masking TFRecord applies to it.

TFRecord stores ``masked_crc32c(x) = (rotate_right(crc32c(x), 15) + 0xa282ead8) mod 2**32``
after the length and after the data of every record; the mask keeps a CRC of data that
itself contains CRCs from being trivially zero. CRC-32C (Castagnoli) comes from the
maintained ``google-crc32c`` package, which uses the SSE4.2 / ARMv8 instruction when it
can.
"""
from __future__ import annotations

MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

try:
    import google_crc32c as _gcrc
except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "evenflow.records needs the google-crc32c package, one of evenflow's own dependencies; install it "
        "with `pip install google-crc32c`", name=e.name) from e

_value = _gcrc.value


def crc32c(data) -> int:
    """CRC-32C of a bytes-like object, as an int in ``[0, 2**32)``."""
    return _value(bytes(data) if not isinstance(data, bytes) else data)


def masked_crc32c(data) -> int:
    """The masked CRC-32C that TFRecord stores, as an int in ``[0, 2**32)``."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + MASK_DELTA) & _U32


def unmask_crc(masked: int) -> int:
    """Inverse of the mask: the plain CRC-32C from a stored masked value."""
    rot = (masked - MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32
