"""The shell blocks of README.md and docs/*.md, run with the set-ups of tests/test_doc_blocks.py.

Every block of one page that names the same set-up runs, in page order, in one scratch directory;
the rules (markers, set-ups, the ``train_flags`` a set-up appends, the text its ``shrink`` replaces)
are in tests/test_doc_blocks.py.
"""
from __future__ import annotations

import subprocess

import pytest

from tests import test_doc_blocks as docs

shared_data = docs.shared_data  # the session's converted data, made once per worker


@pytest.mark.slow
@pytest.mark.parametrize("key", list(docs.SH_GROUPS), ids=[f"{p}-{m}" for p, m in docs.SH_GROUPS])
def test_shell_blocks_run(tmp_path, shared_data, key):
    blocks = docs.SH_GROUPS[key]
    setup = docs.SH_SETUPS[key[1]]
    if key[1] in ("install", "ray-cli"):
        for b in blocks:
            (docs._check_install if key[1] == "install" else docs._check_ray_cli)(b.code)
        return
    workdir = docs._workdir(tmp_path, setup.data, shared_data)
    script = ["set -eu"] + list(setup.prepare)
    codes = [docs.console_commands(b.code) if b.lang == "console" else b.code for b in blocks]
    for text, smaller in setup.shrink:
        assert any(text in code for code in codes), f"{key}: set-up {key[1]!r} shrinks {text!r}, which no block holds"
        codes = [code.replace(text, smaller) for code in codes]
    docs._wrappers(workdir, setup.train_flags, "\n".join(codes))
    for b, code in zip(blocks, codes):
        if key[1] == "two-hosts":
            code = docs._two_hosts(code)
        script += [f"echo '=== {b.where}'", code]
    (workdir / ".doc-blocks.sh").write_text("\n".join(script) + "\n")
    try:
        proc = subprocess.run(["timeout", "-k", "5", str(setup.timeout), "bash", ".doc-blocks.sh"], cwd=workdir,
                              env=docs._env(workdir), capture_output=True, text=True, timeout=setup.timeout + 20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{key}: the blocks did not finish within {setup.timeout} s")
    assert proc.returncode == 0, (f"{', '.join(b.where for b in blocks)}: a command failed (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-2500:]}\n{proc.stderr[-3000:]}")
