"""What the checkpoint digests cost: a save's digests and a restore's check, against the save itself.

For each model (the demo's MLP, 26k weights, and a wide MLP of ~25M weights), both with Adam
after one step (so the optimizer's moments exist), this saves a crash-safe checkpoint with
``evenflow.run.Checkpointer`` (PyTorch state: safetensors) ``--repeats`` times and times, per save,

* ``save``: the whole ``Checkpointer.save`` (writing, digests, fsyncs, rename);
* ``digest``: ``file_digests`` of the written directory (the part of the save the digests add);
* ``verify``: ``files_problem`` (sizes, then every file's BLAKE2b), what a resume adds before loading;
* ``load``: ``TorchState.read`` of the same checkpoint (the framework's reader), for scale.

Medians in ms. Usage: ``.venv/bin/python benchmarks/checkpoint_digests.py [--repeats 5]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _common import ROOT, machine, write_result  # noqa: E402

from evenflow.plan.cursor import Cursor  # noqa: E402
from evenflow.run.checkpoint_trust import file_digests, files_problem  # noqa: E402
from evenflow.run.checkpoints import Checkpointer, list_checkpoints  # noqa: E402


def _model(kind: str):
    import torch

    if kind == "mlp":  # the demo's (evenflow.torch.models mlp on 8x8 digits): 64 -> 128 -> 128 -> 10
        layers = [torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                  torch.nn.ReLU(), torch.nn.Linear(128, 10)]
    else:  # wide: 1024 -> 4096 -> 4096 -> 10, ~21M weights
        layers = [torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                  torch.nn.Linear(4096, 10)]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.randn(8, 64 if kind == "mlp" else 1024)
    model(x).sum().backward()
    optimizer.step()
    return model, optimizer


def measure(kind: str, repeats: int) -> dict:
    from evenflow.torch.state import TorchState

    model, optimizer = _model(kind)
    state = TorchState(model, optimizer)
    times = {"save": [], "digest": [], "verify": [], "load": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Checkpointer(tmp, state, keep=2)
        for i in range(repeats):
            began = time.perf_counter()
            path = ckpt.save(Cursor(0, i + 1))
            times["save"].append(time.perf_counter() - began)
            began = time.perf_counter()
            file_digests(path)
            times["digest"].append(time.perf_counter() - began)
            info = list_checkpoints(tmp)[-1]
            began = time.perf_counter()
            assert files_problem(info.path, info.meta) is None
            times["verify"].append(time.perf_counter() - began)
            began = time.perf_counter()
            state.read(info.path)
            times["load"].append(time.perf_counter() - began)
        size = sum(p.stat().st_size for p in Path(info.path).iterdir())
    weights = sum(p.numel() for p in model.parameters())
    return {"model": kind, "weights": weights, "bytes": size,
            **{k: round(statistics.median(v) * 1000, 2) for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = [measure(kind, args.repeats) for kind in ("mlp", "wide")]
    lines = [f"{'model':6} {'weights':>11} {'MB':>8} {'save ms':>9} {'digest ms':>10} {'verify ms':>10} "
             f"{'load ms':>9}"]
    for r in rows:
        lines.append(f"{r['model']:6} {r['weights']:>11,} {r['bytes'] / 1e6:>8.2f} {r['save']:>9.1f} "
                     f"{r['digest']:>10.1f} {r['verify']:>10.1f} {r['load']:>9.1f}")
    import torch

    write_result({"machine": machine(torch=torch.__version__), "repeats": args.repeats, "rows": rows},
                 "\n".join(lines), ROOT / "results" / "checkpoint_digests.json")


if __name__ == "__main__":
    main()
