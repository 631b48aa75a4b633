"""TFRecord files: the frame layout, CRC-32C, writing and reading, scanning and walking frames.

Internal: the public names are exported by :mod:`evenflow.records`.
"""
