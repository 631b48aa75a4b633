"""GPU benchmark: how busy evenflow's PyTorch trainer keeps one GPU, against DataLoader loops.

Everything is generated on the machine (nothing is downloaded): ``--samples`` images of
``--size`` x ``--size`` x 3 pixels, 10 classes, smooth random patterns with a tint per class.

Workloads:

* ``arrays``: the images as float32 arrays in memory, read through ``--array-workers``
  loader workers (``evenflow.data.ArraySource``; ``TensorDataset`` for the plain loops);
* ``jpeg``: the same images as JPEG files in class folders. evenflow reads them converted to
  records (``evenflow convert photos/ recs --shards 16``; decoded in ``--jpeg-workers``
  loader workers); the plain loops read the files (PIL decode in ``__getitem__``, the way a
  user writes a folder dataset), with as many workers.

Models: ``cnn`` (``evenflow.torch.build_model("cnn")``: small, so the host's per-step work
decides) and ``resnet18`` (torchvision, no pretrained weights: enough work per step to keep the
GPU busy when the input keeps up).

Methods, on the same global batch, with Adam:

* ``plain``: ``DataLoader(shuffle=True, pin_memory=True, num_workers=W, persistent_workers=True)``,
  batches copied with ``non_blocking=True``, the mean cross-entropy, the epoch's loss read once
  per epoch;
* ``ddp``: the same with ``DistributedSampler`` and the model in ``DistributedDataParallel``
  (nccl, one rank): what a DDP script runs on one GPU;
* ``evenflow``: ``evenflow.torch.Trainer(model, optimizer, device="cuda").fit(...)`` over the
  plan (masked loss, agreed skip of non-finite updates, exact epoch figures; batches
  page-locked and copied without blocking);
* ``evenflow-cli`` (jpeg, cnn): ``evenflow train --framework torch`` on the records, end to end
  (run directory, telemetry, a checkpoint at the end), once before and once after the rest.

The three API methods of one workload and model share a process: after a warm-up epoch each,
``--rounds`` rounds call each method in alternating order for ``--epochs`` epochs, the first
of which (evenflow starts its loader workers per call) is not timed.

Figures: samples/s over the timed epochs, the GPU's busy percentage over the same epochs
(NVML's utilisation: the share of time a kernel was running, sampled every 50 ms by this
process), and evenflow's ratio to the faster of ``plain`` and ``ddp`` in the same round
(the command's: to their median). ``--profile`` adds one untimed, profiled call of evenflow
and of plain on arrays/resnet18 (``<JSON name>_profile_*.txt`` beside the JSON).

Examples:
    python benchmarks/gpu_busy.py                       # on a GPU: 50,000 images, both models, 2 rounds
    python benchmarks/gpu_busy.py --device cpu --quick  # a check of the script on a CPU (no busy figures)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result, free_port  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent
SRC = ROOT.parent / "src"
CLASSES = 10
WORKLOADS = ("jpeg", "arrays")
MODELS = ("cnn", "resnet18")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--samples", type=int, default=50_000, help="images (default 50,000)")
    p.add_argument("--size", type=int, default=32, help="image height and width (default 32)")
    p.add_argument("--global-batch-size", type=int, default=256, help="samples per step (default 256)")
    p.add_argument("--epochs", type=int, default=3,
                   help="epochs per call; the first (loader start-up) is not timed (default 3)")
    p.add_argument("--array-workers", type=int, default=4, help="loader workers for arrays (default 4)")
    p.add_argument("--jpeg-workers", type=int, default=8, help="loader workers for JPEG images (default 8)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    p.add_argument("--rounds", type=int, default=2, help="timed calls per method, in alternating order (default 2)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one call of evenflow and of plain on arrays/resnet18 (cProfile, untimed)")
    p.add_argument("--deadline", type=float, default=0, help="seconds after which no new run starts (0: none)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu, to check the script without a GPU")
    p.add_argument("--quick", action="store_true", help="2,048 images, 2 epochs, 2 workers")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "gpu_busy.json",
                   help="where to write the results (default benchmarks/results/gpu_busy.json)")
    p.add_argument("--child", nargs=4, metavar=("WORKLOAD", "MODEL", "DATA", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.epochs, args.rounds, args.array_workers, args.jpeg_workers = 2048, 2, 1, 2, 2
    if args.epochs < 2:
        p.error(f"--epochs must be at least 2 (the first is not timed), got {args.epochs}")
    for name, value, known in (("--workloads", args.workloads, WORKLOADS), ("--models", args.models, MODELS)):
        bad = [v for v in value.split(",") if v not in known]
        if bad:
            p.error(f"{name} takes {', '.join(known)}, got {', '.join(bad)}")
    return args


# -- data ------------------------------------------------------------------------------------------
def make_images(n: int, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 ``[n, size, size, 3]`` smooth random images and int64 labels (a tint per class)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n).astype(np.int64)
    coarse = rng.integers(0, 256, (n, 4, 4, 3)).astype(np.float32)
    reps = -(-size // 4)
    images = np.repeat(np.repeat(coarse, reps, axis=1), reps, axis=2)[:, :size, :size]
    tint = np.linspace(0, 60, CLASSES, dtype=np.float32)[labels][:, None, None, None]
    return np.clip(images * 0.75 + tint, 0, 255).astype(np.uint8), labels


def write_data(args, root: Path) -> dict:
    """The arrays (.npy), the JPEG folder and its records; seconds each part took."""
    from PIL import Image

    took = {}
    t = time.perf_counter()
    images, labels = make_images(args.samples, args.size)
    np.save(root / "x.npy", images.astype(np.float32) * np.float32(1 / 255))
    np.save(root / "y.npy", labels)
    took["arrays_s"] = time.perf_counter() - t
    if "jpeg" not in args.workloads.split(","):
        return took
    t = time.perf_counter()
    photos = root / "photos"
    for c in range(CLASSES):
        (photos / f"class{c:02d}").mkdir(parents=True)
    for i, (img, label) in enumerate(zip(images, labels)):
        Image.fromarray(img).save(photos / f"class{label:02d}" / f"{i:07d}.jpg", quality=90)
    took["jpeg_files_s"] = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "evenflow", "convert", str(photos), str(root / "recs"), "--shards", "16"],
                   check=True, env=_env(), stdout=subprocess.DEVNULL)
    took["convert_s"] = time.perf_counter() - t
    return took


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}


# -- one run (a child process) ----------------------------------------------------------------------
def _model(name: str, size: int):
    import torch

    if name == "cnn":
        from evenflow.torch import build_model
        return build_model("cnn", (size, size, 3), CLASSES)
    import torchvision

    class ChannelsFirst(torch.nn.Module):
        def forward(self, x):
            return x.permute(0, 3, 1, 2)

    return torch.nn.Sequential(ChannelsFirst(), torchvision.models.resnet18(num_classes=CLASSES))


class FolderImages:
    """The map-style dataset a user writes over ``photos/<class>/<file>.jpg``: PIL decode per item."""

    def __init__(self, root: Path):
        self.items = [(str(f), c) for c, d in enumerate(sorted(root.iterdir())) for f in sorted(d.iterdir())]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            pixels = np.asarray(im.convert("RGB"), np.float32) * np.float32(1 / 255)
        return torch.from_numpy(pixels), label


def _plain_dataset(workload: str, data: Path):
    import torch

    if workload == "arrays":
        return torch.utils.data.TensorDataset(torch.from_numpy(np.load(data / "x.npy")),
                                              torch.from_numpy(np.load(data / "y.npy")))
    return FolderImages(data / "photos")


def plain_runner(args, workload: str, model_name: str, data: Path, ddp: bool):
    """``run(epochs) -> epoch rows`` of the plain loop (its loader workers live across calls)."""
    import torch
    import torch.distributed as dist

    device = torch.device(args.device)
    workers = args.array_workers if workload == "arrays" else args.jpeg_workers
    dataset = _plain_dataset(workload, data)
    torch.manual_seed(0)
    model = _model(model_name, args.size).to(device)
    sampler = None
    if ddp:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if device.type == "cuda" else None)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.global_batch_size, shuffle=sampler is None,
                                         sampler=sampler, num_workers=workers, pin_memory=device.type == "cuda",
                                         persistent_workers=workers > 0, drop_last=False)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    done = [0]

    def run(epochs: int) -> list[dict]:
        rows = []
        for epoch in range(done[0], done[0] + epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            began, total, seen = time.time(), torch.zeros((), device=device), 0
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.detach()
                seen += int(y.shape[0])
            float(total)  # the epoch's loss, read once as a script logs it (waits for the GPU)
            rows.append({"epoch": epoch, "began": began, "ended": time.time(), "samples": seen})
        done[0] += epochs
        return rows

    return run


def evenflow_runner(args, workload: str, model_name: str, data: Path):
    """``run(epochs) -> epoch rows`` of ``evenflow.torch.Trainer.fit`` (one loader per call, as ``fit`` has)."""
    import torch

    import evenflow as ef
    from evenflow.data import ArraySource, RecordSource
    from evenflow.data.images import DecodeImages
    from evenflow.torch import Trainer

    if workload == "arrays":
        source, workers = ArraySource(np.load(data / "x.npy"), np.load(data / "y.npy")), args.array_workers
    else:
        source = RecordSource(data / "recs", decode=DecodeImages((args.size, args.size, 3)))
        workers = args.jpeg_workers
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=args.global_batch_size, seed=0)
    torch.manual_seed(0)
    model = _model(model_name, args.size)
    trainer = Trainer(model, torch.optim.Adam(model.parameters(), 1e-3), device=args.device)
    done = [0]

    def run(epochs: int) -> list[dict]:
        rows, began = [], [time.time()]

        def on_epoch(result):
            rows.append({"epoch": result.epoch, "began": began[0], "ended": time.time(),
                         "samples": int(result.samples)})
            began[0] = time.time()

        trainer.fit(source, plan, done[0] + epochs, start=ef.Cursor(done[0], 0), num_workers=workers,
                    on_epoch=on_epoch)
        done[0] += epochs
        return rows

    return run


RUNNERS = {"evenflow": evenflow_runner, "plain": lambda *a: plain_runner(*a, ddp=False),
           "ddp": lambda *a: plain_runner(*a, ddp=True)}


def child_main(args) -> None:
    """Every method on one workload and model in this process: a warm-up epoch each, then ``--rounds``
    rounds in alternating order, each call ``--epochs`` epochs of which the first (loader start) is untimed."""
    workload, model_name, data, out = args.child
    data = Path(data)
    runs = {m: make(args, workload, model_name, data) for m, make in RUNNERS.items()}
    for run in runs.values():
        run(1)
    rows: dict = {m: [] for m in runs}
    for rnd in range(args.rounds):
        for m in (list(runs) if rnd % 2 == 0 else list(runs)[::-1]):
            rows[m].append(runs[m](args.epochs)[1:])
    if args.profile:
        import cProfile
        import io
        import pstats

        for m in ("evenflow", "plain"):
            prof = cProfile.Profile()
            prof.runcall(runs[m], 2)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            Path(f"{out}.{m}.prof.txt").write_text(text.getvalue())
    Path(out).write_text(json.dumps(rows))


# -- the GPU's busy share -------------------------------------------------------------------------------
class BusySampler:
    """NVML's GPU utilisation every 50 ms on a thread, and when telemetry lines of an epoch appeared."""

    def __init__(self, enabled: bool):
        self.samples: list[tuple[float, int]] = []
        self.watch: Path | None = None
        self.marks: dict[int, list[float]] = {}  # epoch -> [first line seen, last line seen]
        self._stop = threading.Event()
        self._handle = None
        if enabled:
            try:
                import pynvml
                pynvml.nvmlInit()
                self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            except Exception as e:  # noqa: BLE001 - no NVML: no busy figures, said in the table
                print(f"no GPU busy figures: {type(e).__name__}: {e}")
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        watched, offset = None, 0
        while not self._stop.wait(0.05):
            now = time.time()
            if self._handle is not None:
                self.samples.append((now, self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            watch = self.watch
            if watch != watched:  # a new run's file: read it from its start
                watched, offset = watch, 0
            if watch is not None and watch.exists():
                with open(watch) as f:
                    f.seek(offset)
                    chunk = f.read()
                complete = chunk[:chunk.rfind("\n") + 1]
                offset += len(complete)
                for line in complete.splitlines():
                    if '"kind": "step"' in line:
                        self.marks.setdefault(int(json.loads(line)["epoch"]), [now, now])[1] = now

    def busy(self, begin: float, end: float) -> float | None:
        inside = [u for t, u in self.samples if begin <= t <= end]
        return statistics.fmean(inside) if inside else None

    def close(self):
        self._stop.set()
        self._thread.join()


# -- the driver ------------------------------------------------------------------------------------------
def _cli_run(args, data: Path, tmp: Path, sampler: BusySampler) -> dict:
    run_dir = tmp / "cli-run"
    sampler.watch, sampler.marks = run_dir / "telemetry.jsonl", {}
    cmd = [sys.executable, "-m", "evenflow", "train", "--framework", "torch", "--dataset", str(data / "recs"),
           "--model", "cnn", "--epochs", str(args.epochs), "--global-batch-size", str(args.global_batch_size),
           "--loader-workers", str(args.jpeg_workers), "--test-fraction", "0", "--learning-rate", "0.001",
           "--output-dir", str(run_dir)]
    began = time.time()
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    wall = time.time() - began
    time.sleep(0.1)
    sampler.watch = None
    if done.returncode:
        raise RuntimeError(f"evenflow train exited {done.returncode}: {done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    steady = summary["history"][1:]
    window = (sampler.marks[1][0], sampler.marks[args.epochs - 1][1]) if len(sampler.marks) >= args.epochs else None
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    return {"samples_per_s": sum(h["samples"] for h in steady) / sum(h["seconds"] for h in steady),
            "busy": sampler.busy(*window) if window else None, "wall_s": wall,
            "devices": summary.get("devices")}


def _child_run(args, workload, model_name, data: Path, tmp: Path, sampler: BusySampler) -> dict:
    """Rows per API method of one child process: samples/s and busy % of every timed call."""
    out = tmp / f"child-{workload}-{model_name}.json"
    profile = args.profile and (workload, model_name) == ("arrays", "resnet18")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--samples", str(args.samples), "--size", str(args.size),
           "--global-batch-size", str(args.global_batch_size), "--epochs", str(args.epochs),
           "--rounds", str(args.rounds), "--array-workers", str(args.array_workers),
           "--jpeg-workers", str(args.jpeg_workers), "--device", args.device,
           *(["--profile"] if profile else []), "--child", workload, model_name, str(data), str(out)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{workload}/{model_name} exited {done.returncode}: {done.stderr[-3000:]}")
    if profile:
        for m in ("evenflow", "plain"):
            (args.json_out.parent / f"{args.json_out.stem}_profile_{m}.txt").write_text(Path(f"{out}.{m}.prof.txt").read_text())
    rows = {}
    for method, calls in json.loads(out.read_text()).items():
        rows[method] = [{"samples_per_s": sum(e["samples"] for e in call) / sum(e["ended"] - e["began"] for e in call),
                         "busy": sampler.busy(call[0]["began"], call[-1]["ended"])} for call in calls]
    return rows


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _table(result: dict) -> str:
    lines = ["| workload | model | method | samples/s | GPU busy % | ratio (per round) |", "|---|---|---|---|---|---|"]
    for key, rows in result["runs"].items():
        workload, model_name = key.split("/")
        best = [max(p["samples_per_s"], d["samples_per_s"]) for p, d in zip(rows["plain"], rows["ddp"])]
        if key == "jpeg/cnn":
            rows = {**rows, "evenflow-cli": result["cli"]}
        for method, calls in rows.items():
            if not calls:  # not run before the deadline
                continue
            busy = _median(c["busy"] for c in calls)
            ratio = ""
            if method.startswith("evenflow") and best:
                per = [c["samples_per_s"] / b for c, b in zip(calls, best)] if method == "evenflow" else \
                    [c["samples_per_s"] / statistics.median(best) for c in calls]
                ratio = f"{statistics.median(per):.3f} ({', '.join(f'{r:.2f}' for r in per)})"
            lines.append(f"| {workload} | {model_name} | {method} | {_median(c['samples_per_s'] for c in calls):,.0f} | "
                         f"{'-' if busy is None else f'{busy:.1f}'} | {ratio} |")
    return "\n".join(lines)


def main(args) -> dict:
    started = time.time()
    info = {"device": args.device}
    if args.device == "cuda":
        import torch
        info.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda)
    result = {"machine": machine(**info), "args": {k: str(v) for k, v in vars(args).items() if k != "child"},
              "runs": {}, "cli": [], "errors": {}}
    sampler = BusySampler(args.device == "cuda")
    combos = [(w, m) for w in args.workloads.split(",") for m in args.models.split(",")]
    cli = ("jpeg", "cnn") in combos
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "data"
        data.mkdir()
        result["data_seconds"] = write_data(args, data)
        print(f"data written in {sum(result['data_seconds'].values()):.1f} s: {result['data_seconds']}", flush=True)
        jobs = ([("cli",)] if cli else []) + combos + ([("cli",)] if cli else [])
        for job in jobs:
            if args.deadline and time.time() - started > args.deadline:
                print(f"deadline reached: {'/'.join(job)} not run", flush=True)
                continue
            try:
                if job == ("cli",):
                    result["cli"].append(_cli_run(args, data, tmp, sampler))
                    print(f"evenflow-cli: {result['cli'][-1]}", flush=True)
                else:
                    key = "/".join(job)
                    result["runs"][key] = _child_run(args, *job, data, tmp, sampler)
                    print(f"{key}: {result['runs'][key]}", flush=True)
            except RuntimeError as e:
                result["errors"].setdefault("/".join(job), []).append(str(e))
                print(f"{'/'.join(job)} failed: {e}", flush=True)
    sampler.close()
    if cli and "jpeg/cnn" not in result["runs"]:
        result["runs"]["jpeg/cnn"] = {"plain": [], "ddp": []}
    return write_result(result, _table(result), args.json_out)


if __name__ == "__main__":
    parsed = parse_args()
    if parsed.child:
        child_main(parsed)
    else:
        main(parsed)
