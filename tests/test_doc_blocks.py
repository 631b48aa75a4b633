"""Every Python and shell block of README.md and docs/*.md runs on small data, so the docs cannot drift.

Each fenced block is preceded (on one of the two lines before it) by a marker ``<!-- test: NAME -->``
naming one of the set-ups below; a runnable block without a known marker fails this test, and so does
a fence without a language.

- `````python`` blocks: NAME is a key of ``PY_SETUPS``: code run before the block (the variables its
  prose assumes: a user's arrays, their model) and shared data copied into a scratch working
  directory. Each Python block runs in a fresh process. Set-up ``alone`` runs nothing before the
  block: it runs verbatim, as a reader copies it, imports and data included. Every Python block of
  README.md names ``alone``.
- `````bash`` / `````sh`` / `````console`` blocks: NAME is a key of ``SH_SETUPS``. Every block of one
  page that names the same set-up runs, in page order, in one scratch directory, so a later block
  sees what an earlier one wrote. ``evenflow`` runs ``python -m evenflow`` with ``PYTHONPATH=src``
  (a script on ``PATH``, so ``evenflow launch -- evenflow train`` works too), ``python`` is this
  interpreter and ``torchrun`` is ``python -m torch.distributed.run``. In a `````console`` block only
  the lines after ``$ `` (with their ``\\`` continuations) run; the rest is output and not compared.
  A set-up may *shrink* the commands: its ``train_flags`` are appended to every ``evenflow train``
  and ``evenflow demo`` command (and to ``torchrun ... evenflow train``), e.g. ``--epochs 1``, so a
  page can show the command a user runs while the test runs it on one epoch. Its ``shrink`` pairs
  replace text in the commands before they run, each pair at least once, e.g. the sample count of
  the array a block generates, so the test runs the page's commands on less data.
- Set-up ``two-hosts``: the part of the block after ``# on hostA:`` and the part after
  ``# on hostB:`` run at the same time, with ``hostA:12345`` / ``hostB:12345`` replaced by free
  ``127.0.0.1`` ports and ``/shared/`` by a local directory.
- Set-up ``install``: the block is not run. Each ``make TARGET`` must be a target of the Makefile and
  each ``pip install`` must name extras that ``pyproject.toml`` defines (``make demo`` and ``make test``
  themselves create a virtual environment and install packages, which a test must not do).
- Set-up ``ray-cli``: ``evenflow train --engine ray`` commands, not run here (a Ray cluster and its
  workers take a minute per command): tests/ray/test_ray_train.py runs such a command with each framework,
  a worker killed, and audits it. Each command of the block must parse with evenflow's own parser, and
  every flag it gives must be one that the test of its framework passes (``--framework tf``: the flags of
  tests/ray/_ray_tf_loop.py).
- `````text``, `````toml`` and `````json`` blocks are output or file contents and do not run.

Data that several blocks need (``data/digits``: ``evenflow convert builtin:digits data/digits
--shards 3``) is converted once per test session and copied into each scratch directory.

This file reads the pages and runs the Python blocks; tests/test_doc_shell_blocks.py runs the
shell blocks with the same set-ups (two files, so that ``--dist loadfile`` gives them to both
pytest-xdist workers).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from evenflow.tf.launch.local import free_ports
from tests._warm import warm_python

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MARKER = re.compile(r"^<!-- test: (\S+) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")
RUN_LANGS = {"python", "bash", "sh", "console"}
QUIET_LANGS = {"text", "toml", "json"}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# A user's arrays: the first 400 of scikit-learn's digits, read as evenflow reads them (the file
# scikit-learn ships, without importing scikit-learn and SciPy: 1-2 CPU-seconds less per block).
DIGITS = """
import numpy as np
from evenflow.data.digits import load_digits
_images, _target = load_digits()
x, y = (_images.reshape(-1, 64)[:400] / 16.0).astype(np.float32), _target[:400]
x_train, y_train, x_test, y_test = x[:300], y[:300], x[300:], y[300:]
"""

# name -> (code run before the block, shared data copied into the working directory)
PY_SETUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "alone": ("", ()),  # the block as written, nothing before it
    "plan": ("import numpy as np\n_r = np.random.default_rng(0)\nlabels = _r.integers(0, 10, 10_000)\n"
             "lengths = _r.integers(1, 512, 10_000)\n", ()),
    "plan-timing": ("n, r = 20_000, 8\n", ()),
    "tf-trainer": (DIGITS, ()),
    "keras-fit": (DIGITS + "import keras\n", ()),
    "cluster": (DIGITS + "import evenflow.data\nsource = evenflow.data.ArraySource(x, y)\n", ()),
    "records": ("import numpy as np\nids = np.array([5, 0, 7, 7])\n", ("digits",)),
    "torch-trainer": (DIGITS + "import evenflow as ef\nfrom evenflow.data import ArraySource\n"
                      "test_source = ArraySource(x_test, y_test)\n"
                      "test_plan = ef.Plan(test_source.index(), ef.Topology(1), global_batch_size=64)\n",
                      ("digits",)),
    "torch-own": (DIGITS + "import torch\ndataset = torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y))\n"
                  "model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))\n"
                  "optimizer = torch.optim.SGD(model.parameters(), 0.1)\n", ()),
    # Ray Train quiet: no usage report, each worker line once (the block starts its own local cluster).
    "ray": ("import os\nos.environ.update(RAY_DEDUP_LOGS='0', RAY_USAGE_STATS_ENABLED='0', "
            "RAY_TRAIN_ENABLE_PRINT_PATCH='0')\n", ()),
    "token-writer": ("import os\nimport numpy as np\nimport tensorflow as tf\nos.makedirs('data/tokens')\n"
                     "_r = np.random.default_rng(0)\nsamples = [(_r.integers(0, 3000, _r.integers(0, 40)).tolist(), "
                     "int(_r.integers(0, 4))) for _ in range(60)]\n", ()),
    # TFRecord files as a user has them (written without TensorFlow: the block starts it itself).
    "tf-chain": ("import io\nimport numpy as np\nimport keras\nfrom PIL import Image\n"
                 "from evenflow.data.digits import load_digits\n"
                 "from evenflow.records import RecordWriter, encode_example\n"
                 "_images, _target = load_digits()\nfiles = ['digits-0.tfrecord', 'digits-1.tfrecord']\n"
                 "for _k, _path in enumerate(files):\n"
                 "    with RecordWriter(_path, write_index=False) as _w:\n"
                 "        for _img, _y in zip(_images[_k::2], _target[_k::2]):\n"
                 "            _b = io.BytesIO()\n"
                 "            Image.fromarray((_img * 16).clip(0, 255).astype(np.uint8)).save(_b, format='PNG')\n"
                 "            _w.write(encode_example({'image': _b.getvalue(), 'label': int(_y)}))\n", ()),
    "token-api": ("import numpy as np\n_r = np.random.default_rng(0)\nnum_classes = 4\n"
                  "token_lists = [_r.integers(0, 5000, _r.integers(1, 60)) for _ in range(300)]\n"
                  "labels = _r.integers(0, num_classes, 300)\n", ()),
}


@dataclass(frozen=True)
class Shell:
    """How the shell blocks naming one set-up run."""

    data: tuple[str, ...] = ()           # shared data copied in first ("digits": data/digits)
    prepare: tuple[str, ...] = ()        # shell lines run before the first block
    train_flags: str = ""                # appended to every `evenflow train` / `evenflow demo`
    shrink: tuple[tuple[str, str], ...] = ()  # (text, replacement) in the commands: the same run on less data
    timeout: int = 300


ONE_EPOCH = "--epochs 1"
INPUTS = f"python {ROOT / 'tests' / '_doc_inputs.py'}"   # + a function name of tests/_doc_inputs.py
SH_SETUPS: dict[str, Shell] = {
    "install": Shell(),
    "ray-cli": Shell(),                                          # checked, not run: see _check_ray_cli
    "two-hosts": Shell(train_flags=ONE_EPOCH),
    "cli": Shell(),                                              # quick commands as written
    "cli-data": Shell(data=("digits",)),                         # ... with data/digits converted
    "train": Shell(train_flags=ONE_EPOCH),                       # training commands, one epoch each
    "train-data": Shell(data=("digits",), train_flags=ONE_EPOCH),
    # 2,048 generated images instead of 8,192: 2 steps of the global batch of 1,024 instead of 8.
    "slow-core": Shell(train_flags=ONE_EPOCH, shrink=(("8192", "2048"),)),
    "npz-data": Shell(data=("digits",), prepare=(f"{INPUTS} npz_data",), train_flags=ONE_EPOCH),
    "own-records": Shell(prepare=(f"{INPUTS} own_records",), train_flags=ONE_EPOCH),
    # ... and text_cnn trains on every 6th docstring of the converted stdlib-docs (data/docs-small, as for ps-text).
    "tokens": Shell(prepare=(f"{INPUTS} token_records", f"{INPUTS} small_docs"), train_flags=ONE_EPOCH,
                    shrink=(("--dataset data/docs --model text_cnn", "--dataset data/docs-small --model text_cnn"),)),
    # Parameter servers on every 6th docstring (the builtin's records, ~1,070): 14 steps of the PS loop instead of 81.
    "ps-text": Shell(prepare=(f"{INPUTS} small_docs",), train_flags=ONE_EPOCH,
                     shrink=(("--dataset builtin:stdlib-docs", "--dataset data/docs-small"),)),
    "convert-inputs": Shell(prepare=(f"{INPUTS} convert_inputs",)),
    "benchmark": Shell(),                                        # benchmarks/ scripts with small arguments
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    marker: str | None
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a page, and the problems found while reading them."""
    lines = page.read_text().splitlines()
    blocks, problems, i = [], [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m[1], i
        marker = next((mm[1] for mm in (MARKER.match(lines[j].strip()) for j in range(max(0, i - 2), i)) if mm),
                      None)
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        where = f"{page.relative_to(ROOT)}:{start + 1}"
        if not lang:
            problems.append(f"{where}: a fence without a language (use ```text for output)")
        elif lang not in RUN_LANGS | QUIET_LANGS:
            problems.append(f"{where}: unknown block language {lang!r} (known: {sorted(RUN_LANGS | QUIET_LANGS)})")
        elif lang in RUN_LANGS:
            known = PY_SETUPS if lang == "python" else SH_SETUPS
            if marker not in known:
                problems.append(f"{where}: a {lang} block needs a '<!-- test: NAME -->' line naming one of "
                                f"{', '.join(known)} (tests/test_doc_blocks.py), found {marker!r}")
            blocks.append(Block(page, start + 1, lang, marker, "\n".join(body)))
    return blocks, problems


BLOCKS: list[Block] = []
PROBLEMS: list[str] = []
for _page in PAGES:
    _b, _p = blocks_of(_page)
    BLOCKS += _b
    PROBLEMS += _p
# Blocks with the same code and set-up (a quick start repeated in its guide) run once, named by every place.
PY_BLOCKS: dict[tuple[str, str], list[Block]] = {}
for _b in BLOCKS:
    if _b.lang == "python" and _b.marker in PY_SETUPS:
        PY_BLOCKS.setdefault((_b.marker, _b.code), []).append(_b)
SH_GROUPS: dict[tuple[str, str], list[Block]] = {}
for _b in BLOCKS:
    if _b.lang != "python" and _b.marker in SH_SETUPS:
        SH_GROUPS.setdefault((str(_b.page.relative_to(ROOT)), _b.marker), []).append(_b)


def test_every_block_has_a_language_and_a_test_marker():
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_every_readme_python_block_runs_alone():
    """A reader copies a README block as it stands: no set-up may supply its imports or data."""
    readme = [b for b in BLOCKS if b.page.name == "README.md" and b.lang == "python"]
    assert readme, "README.md has no Python block"
    assert all(b.marker == "alone" for b in readme), \
        [f"{b.where}: marker {b.marker!r}, not 'alone'" for b in readme if b.marker != "alone"]


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    env["PATH"] = f"{workdir / '.bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("TF_CONFIG", None)
    env.pop("EVENFLOW_REPLICAS_PER_WORKER", None)
    return env


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory) -> dict[str, Path]:
    """Data several blocks read, made once per session: name -> directory to copy to data/<name>."""
    root = tmp_path_factory.mktemp("doc-data")
    env = _env(root)
    done = subprocess.run([sys.executable, "-m", "evenflow", "convert", "builtin:digits", str(root / "digits"),
                           "--shards", "3"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"digits": root / "digits"}


def _workdir(tmp_path: Path, data: tuple[str, ...], shared: dict[str, Path]) -> Path:
    for name in data:
        shutil.copytree(shared[name], tmp_path / "data" / name)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("key", list(PY_BLOCKS),
                         ids=["+".join(f"{b.page.name}:{b.line}" for b in v) + f"-{k[0]}" for k, v in PY_BLOCKS.items()])
def test_python_block_runs(tmp_path, shared_data, key):
    marker, code = key
    where = ", ".join(b.where for b in PY_BLOCKS[key])
    setup, data = PY_SETUPS[marker]
    workdir = _workdir(tmp_path, data, shared_data)
    program = textwrap.dedent(setup) + "\n" + code + "\n"
    env = _env(workdir)
    try:
        proc = subprocess.run(["timeout", "-k", "5", "240", *_block_python(program, marker, env), "-c", program],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=260)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: the block did not finish within 240 s")
    assert proc.returncode == 0, f"{where}: the block failed:\n{proc.stderr[-3000:]}"


def _block_python(program: str, marker: str, env: dict) -> list[str]:
    """The interpreter a Python block runs in: started warm (tests/_warm.py) with the one framework it imports.

    A block that imports both frameworks, or neither, and the Ray block (Ray's own processes import what they
    need) start fresh.
    """
    uses = {fw for fw, pattern in (("tensorflow", r"\b(tensorflow|keras|evenflow\.tf)\b"), ("torch", r"\btorch\b"))
            if re.search(pattern, program)}
    if marker == "ray" or len(uses) != 1:
        return [sys.executable]
    return warm_python(env, uses.pop())


def console_commands(code: str) -> str:
    """The commands of a ```console block: each line after '$ ', with its backslash continuations."""
    out, cont = [], False
    for line in code.splitlines():
        if cont:
            out.append(line)
        elif line.startswith("$ "):
            out.append(line[2:])
        else:
            continue
        cont = line.rstrip().endswith("\\")
    return "\n".join(out)


def _wrappers(workdir: Path, train_flags: str, script: str = "") -> None:
    """``evenflow``, ``torchrun`` and ``python`` on PATH, with the set-up's flags after train/demo.

    The framework processes of ``script`` start warm (tests/_warm.py: forked from a process that has imported
    TensorFlow, or torch): ``evenflow train`` and ``evenflow demo`` (with ``--framework torch``: torch), the
    workers ``evenflow launch`` starts with them, and ``torchrun``'s agent and ranks (which it starts as
    ``.bin/warm-torch -m MODULE`` with ``--no-python``, unbuffered as its ``python -u`` would). The other
    commands, and a ``--verbose`` run (it sets the frameworks' log levels before their import), start fresh.
    """
    bindir = workdir / ".bin"
    bindir.mkdir(exist_ok=True)
    py = shlex.quote(sys.executable)
    flags = train_flags
    tf, torch = (shlex.join(warm_python(_env(workdir), fw)) if needed else py for fw, needed in (
        ("tensorflow", re.search(r"\bevenflow (train|demo)\b", script)), ("torch", re.search(r"torch", script))))
    (bindir / "evenflow").write_text(
        "#!/bin/sh\n"
        f'case "$1" in train|demo) set -- "$@" {flags} ;; *) exec {py} -m evenflow "$@" ;; esac\n'
        f'case " $* " in *" --verbose "*) exec {py} -m evenflow "$@" ;; '
        f'*" --framework torch "*|*" --framework=torch "*) exec {torch} -m evenflow "$@" ;; esac\n'
        f'exec {tf} -m evenflow "$@"\n')
    (bindir / "warm-torch").write_text(f'#!/bin/sh\ncase " $* " in *" --verbose "*) exec {py} -u "$@" ;; esac\n'
                                       f'PYTHONUNBUFFERED=1 exec {torch} "$@"\n')
    # torchrun [OPTIONS] -m MODULE ARGS -> torchrun [OPTIONS] --no-python .bin/warm-torch -m MODULE ARGS
    (bindir / "torchrun").write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" evenflow train "*) set -- "$@" {flags} ;; esac\n'
        'moved=""\n'
        'for word in "$@"; do\n'
        '  [ -z "$moved" ] && set -- && moved=no\n'
        '  if [ "$moved" = no ] && [ "$word" = -m ]; then '
        f'set -- "$@" --no-python {shlex.quote(str(bindir / "warm-torch"))} -m; moved=yes\n'
        '  else set -- "$@" "$word"; fi\n'
        'done\n'
        f'exec {torch} -m torch.distributed.run "$@"\n')
    (bindir / "python").write_text(f'#!/bin/sh\nexec {py} "$@"\n')
    for f in bindir.iterdir():
        f.chmod(0o755)


def _two_hosts(code: str) -> str:
    """Run the '# on hostA:' and '# on hostB:' parts of a block at once, on 127.0.0.1 ports."""
    parts, current = {"": []}, ""
    for line in code.splitlines():
        m = re.match(r"^# on (host\w+):", line)
        if m:
            current = m[1]
            parts[current] = []
        else:
            parts[current].append(line)
    hosts = [h for h in parts if h]
    assert len(hosts) >= 2, "a two-hosts block needs '# on hostA:' and '# on hostB:' parts"
    ports = dict(zip(hosts, free_ports(len(hosts))))
    script = "\n".join(parts[""]) + "\n"
    for h in hosts:
        text = "\n".join(parts[h])
        for other, port in ports.items():
            text = re.sub(rf"\b{other}:\d+", f"127.0.0.1:{port}", text)
        text = text.replace("/shared/", "shared/")
        script += f"( {text}\n) &\npid_{h}=$!\n"
    script += "".join(f"wait $pid_{h}\n" for h in hosts)
    return script


# The test that runs `evenflow train --engine ray` with each framework (the flags it passes are in these files).
RAY_CLI_TESTS = {"torch": ("tests/ray/test_ray_train.py", "tests/ray/_ray_cli_kill.py"),
                 "tf": ("tests/ray/_ray_tf_loop.py", "tests/ray/_ray_cli_kill.py")}


def _check_ray_cli(code: str) -> None:
    from evenflow.cli import _build_parser

    for line in code.splitlines():
        cmd = line.split("#")[0].strip()
        if not cmd:
            continue
        words = shlex.split(cmd)
        assert words[:2] == ["evenflow", "train"] and "--engine" in words, f"{cmd!r}: not an evenflow train --engine"
        args = _build_parser().parse_args(words[1:])
        assert args.engine == "ray", f"{cmd!r}: --engine is {args.engine!r}, not ray"
        tested = "".join((ROOT / f).read_text() for f in RAY_CLI_TESTS[args.framework])
        flags = [w.split("=")[0] for w in words[2:] if w.startswith("--")]
        untested = [f for f in flags if f'"{f}"' not in tested]
        assert not untested, f"{cmd!r}: {', '.join(untested)} not passed by {RAY_CLI_TESTS[args.framework][0]}"


def _check_install(code: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for line in code.splitlines():
        cmd = line.split("#")[0].strip()
        if not cmd:
            continue
        words = shlex.split(cmd)
        if words[0] == "make":
            for target in words[1:]:
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"Makefile has no target {target!r}"
        elif words[:2] == ["pip", "install"]:
            specs = [w for w in words[2:] if "[" in w]
            assert specs, f"{cmd!r}: no extras to check"
            for spec in specs:
                for extra in spec[spec.index("[") + 1:spec.index("]")].split(","):
                    assert extra in extras, f"{cmd!r}: pyproject.toml has no extra {extra!r}"
        elif words[0] == "git" or words[0] == "cd":
            continue
        else:
            raise AssertionError(f"{cmd!r}: an install block holds only make, pip install, git and cd lines")
