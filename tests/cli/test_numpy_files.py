"""Files that are not what their name says: each reader names the file and what it holds instead.

``np.load`` takes a file with neither numpy's nor a zip header for a pickle, so without a check
of the first bytes a text file fails with numpy's advice to unpickle it, and an ``.npy`` given
for an ``.npz`` loads as one array and fails far from the cause.
"""
from __future__ import annotations

import zipfile

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data.arrays import read_npz as read_dataset
from evenflow.util.files import numpy_file_kind, read_npz


@pytest.fixture()
def files(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(4.0))
    np.savez(tmp_path / "two.npz", x=np.ones((4, 2)), y=np.arange(4))
    (tmp_path / "text.txt").write_text("1\n2\n")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "binary").write_bytes(bytes(range(200, 256)) * 3)
    return tmp_path


def test_the_kind_comes_from_the_first_bytes_not_the_name(files):
    assert [numpy_file_kind(files / name) for name in ("one.npy", "two.npz", "text.txt", "empty", "binary")] == \
        ["npy", "npz", "other", "empty", "other"]
    with pytest.raises(zipfile.BadZipFile, match="an .npy file of one array, not an .npz archive"):
        read_npz(files / "one.npy")


@pytest.mark.parametrize("name, fragment", [
    ("one.npy", "one.npy: is an .npy file of one array, not an .npz archive; save the features and labels together "
                "with numpy.savez(path, x=..., y=...)"),
    ("text.txt", "text.txt: is neither an .npy nor an .npz file (no numpy or zip header); save"),
    ("empty", "empty: is an empty file; save"),
])
def test_a_dataset_that_is_not_an_npz_is_named_with_what_it_is(files, name, fragment):
    with pytest.raises(ValueError) as e:
        read_dataset(files / name, "x", "y")
    assert fragment in str(e.value) and "unsafely" not in str(e.value)
    x, y = read_dataset(files / "two.npz", "x", "y")
    assert x.shape == (4, 2) and y.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("make, fragment", [
    (lambda d: (d / "c.npy").write_text("1\n2\n"), "is neither an .npy nor an .npz file (no numpy or zip header); "
                                                   "save the costs alone with numpy.save"),
    (lambda d: (d / "c.npy").write_bytes((d / "two.npz").read_bytes()), "is an .npz archive of named arrays, "
                                                                        "not an .npy array"),
    (lambda d: (d / "c.npy").write_bytes(b""), "is an empty file"),
    (lambda d: np.save(d / "c.npy", np.ones((4, 2))), "holds an array of shape (4, 2); pass one value per sample"),
    (lambda d: (d / "c.npy").write_bytes((d / "binary").read_bytes()), "is neither an .npy nor an .npz file"),
    (lambda d: (d / "c.npy").mkdir(), "c.npy is a directory"),
])
def test_inspect_names_a_column_file_that_is_not_one_and_exits_2(files, capsys, make, fragment):
    make(files)
    code = main(["inspect", "--replicas", "2", "--batch-size", "2", "--costs", str(files / "c.npy")])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_inspect_reads_a_column_by_its_content_whatever_its_name(files, capsys):
    # An .npy saved under another name is read as one; a binary file that is neither is refused.
    (files / "costs.bin").write_bytes((files / "one.npy").read_bytes())
    assert main(["inspect", "--replicas", "2", "--batch-size", "2", "--costs", str(files / "costs.bin"),
                 "--balance", "cost", "--json"]) == 0
    capsys.readouterr()
    code = main(["inspect", "--replicas", "2", "--batch-size", "2", "--costs", str(files / "binary")])
    err = capsys.readouterr().err
    assert code == 2 and "is neither an .npy array nor UTF-8 text" in err, err
    np.save(files / "column.npy", np.ones((4, 1)))  # one value per sample in a column: read as 4 values
    assert main(["inspect", "--replicas", "2", "--batch-size", "2", "--costs", str(files / "column.npy")]) == 0
