"""docs/img/layers.svg, the one-page picture of the layers, is drawn from the source tree: never stale."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_layers_picture_matches_the_source_tree():
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "make_layers_svg.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_package_and_folder_is_in_the_picture():
    text = (ROOT / "docs" / "img" / "layers.svg").read_text()
    src = ROOT / "src" / "evenflow"
    for package in sorted(p for p in src.iterdir() if (p / "__init__.py").exists()):
        assert f">{package.name}/</text>" in text, package.name
        for folder in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
            assert f">{folder.name}/ " in text, f"{package.name}/{folder.name}"
