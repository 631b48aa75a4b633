"""evenflow.records is framework-free: no TensorFlow (or torch) import, at import time or in use."""
import ast
import pathlib
import subprocess
import sys

import evenflow.records

RECORDS_DIR = pathlib.Path(evenflow.records.__file__).parent
FORBIDDEN = ("tensorflow", "torch", "keras", "jax")


def test_no_framework_import_statements():
    for path in RECORDS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_using_records_loads_no_framework(tmp_path):
    code = f"""
import sys
import numpy as np
import evenflow
from evenflow.data import convert
from evenflow.records import RecordDataset
np.savez({str(tmp_path / 'a.npz')!r}, x=np.ones((5, 2)), y=np.arange(5))
convert({str(tmp_path / 'a.npz')!r}, {str(tmp_path / 'o')!r}, label_key='y', shards=2)
ds = RecordDataset({str(tmp_path / 'o')!r}, check='crc')
ds.decode_batch([0, 4])
evenflow.Index.from_records({str(tmp_path / 'o')!r})
loaded = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]
assert not loaded, loaded
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
