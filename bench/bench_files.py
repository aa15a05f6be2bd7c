"""Files, the command line, checkpoints and the host-memory budget: what each costs a knng call.

Three parts (``--parts``, all by default), one process, any device:

``inputs``
    ``knng.graph`` of the same points handed over as a NumPy array in host memory, as a
    memory-mapped ``.npy`` file, as a tensor on the device, and through the command line
    (``python -m knng graph FILE.npy``, its wall clock: interpreter start and imports
    included); on the benchmark's 8×8 image patches (``--data``, any set of
    ``bench/harness.py --list``) and their Gaussian twin. Every answer is compared with the
    in-memory one bit for bit.
``checkpoints``
    ``knng.graph`` / ``knng.search`` without a checkpoint folder, and with checkpoints every
    60 s (the default: one save at the start of a run this short), every 1 s and after every
    step (0 s, the tests' setting): time, saves and the seconds spent saving (min of
    ``--repeats``).
``streamed``
    A graph of an (n, d) float32 ``.npy`` of clustered points on local disk (``--dir``) under a
    host-memory budget smaller than the file, the file's pages dropped from the page cache
    first (``posix_fadvise``), against the same graph of the array in host memory; with the
    disk's cold read bandwidth, the share of the reading the work hid (the overlap).

Usage (repository root)::

    PYTHONPATH=src:tests python bench/bench_files.py --parts inputs --out inputs.json            # GPU: 8×8 patches
    PYTHONPATH=src:tests python bench/bench_files.py --parts checkpoints --device cpu --out ckpt.json
    PYTHONPATH=src:tests python bench/bench_files.py --parts streamed --n 1000000 --d 960 --host-memory 1GB --dir /tmp
    PYTHONPATH=src:tests python bench/bench_files.py --parts budgets --data gauss --n 2000000 --d 128 --ks 10 --budgets 4GB,512MB
    PYTHONPATH=src:tests python bench/bench_files.py --quick                                   # seconds, any device

``budgets``
    Issue 54's bar: one graph (``--data``, ``--n``, ``--d``; Gaussian by default) from a tensor
    on the device (the reference: the in-memory engine), a NumPy array, a memory-mapped ``.npy``
    and the command line, each with the default budget and under every ``--budgets`` value;
    with each run's plan (parts, resident corpus, frames) and the file's read bandwidth from
    the page cache (a warm sequential read).

The distributed resume check (kill -9 a ``--gpus 2`` run part-way, resume, compare) is
``bench/resume_gpus.sh`` (two GPUs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import knng  # noqa: E402


def same(a: Any, b: Any) -> bool:
    """Whether two answers hold the same indices and distances, bit for bit."""
    return bool(np.array_equal(np.asarray(torch.as_tensor(a.indices).cpu()), np.asarray(torch.as_tensor(b.indices).cpu()))
                and np.array_equal(np.asarray(torch.as_tensor(a.distances).cpu()),
                                   np.asarray(torch.as_tensor(b.distances).cpu())))


# -------------------------------------------------------------------------------- inputs


def command_line_graph(path: Path, k: int, metric: str, device: torch.device, out: Path, repeats: int,
                       options: list[str] | None = None) -> tuple[list[float], "subprocess.CompletedProcess[str]"]:
    """``python -m knng graph`` of ``path`` into ``out``, ``repeats`` times in fresh interpreters:
    the wall-clock times (empty where a run failed, with its error printed) and the last run."""
    command = [sys.executable, "-m", "knng", "graph", str(path), "-k", str(k), "--metric", metric, "-o", str(out),
               "--overwrite", "--no-progress", "--device", str(device), *(options or [])]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if done.returncode:
            print(f"the command line failed ({done.returncode}): {done.stderr[-500:]}", flush=True)
            return [], done
    return times, done


def part_inputs(args: argparse.Namespace, device: torch.device, work: Path) -> list[dict[str, Any]]:
    """knng.graph of host, memory-mapped, device and command-line inputs."""
    x, spec = harness.load_dataset(args.data, n=args.n, d=args.d, seed=args.seed, pictures=args.pictures)
    sets = [(args.data, x, spec.metric), (f"gauss twin of {args.data}",
                                           harness.gaussian(x.shape[0], x.shape[1], args.seed).numpy(), "euclidean")]
    rows = []
    for label, data, metric in sets:
        path = work / "x.npy"
        np.save(path, data)
        for k in args.ks:
            reference = None
            ways = {"numpy in host memory": lambda: data,
                    "memory-mapped .npy": lambda: np.load(path, mmap_mode="r")}
            if device.type == "cuda":
                ways["tensor on the device"] = lambda: torch.from_numpy(data).to(device)
            for way, source in ways.items():
                arg = source()
                timing = harness.time_call(lambda arg=arg: knng.graph(arg, k, metric=metric, device=device), device=device,
                                           warmup=args.warmup, repeats=args.repeats)
                g = timing.result
                if reference is None:
                    reference = g
                r = g.report
                row = {"part": "inputs", "data": label, "shape": list(data.shape), "k": k, "input": way,
                       **timing.as_dict(), "identical": same(g, reference), **harness.report_summary(g)}
                rows.append(row)
                print(f"inputs {label} {data.shape[0]:,} × {data.shape[1]} k={k} {way:22}: median {timing.median:.3f} s "
                      f"min {timing.min:.3f} s; blocks skipped {getattr(r, 'blocks_skipped', '?')}, "
                      f"evaluations {r.store.exact_evaluations:,}; identical {row['identical']}", flush=True)
                del arg, g, timing
                harness.release(device)
            out = work / "cli-out"
            times, _ = command_line_graph(path, k, metric, device, out, args.repeats)
            if times:
                want = np.asarray(torch.as_tensor(reference.indices).cpu())
                identical = bool(np.array_equal(np.load(out / "indices.npy"), want))
                rows.append({"part": "inputs", "data": label, "shape": list(data.shape), "k": k,
                             "input": "command line (wall clock)", "times_s": times, "min_s": min(times),
                             "identical_indices": identical})
                print(f"inputs {label} {data.shape[0]:,} × {data.shape[1]} k={k} {'command line':22}: min "
                      f"{min(times):.3f} s (a fresh interpreter each time); identical indices {identical}", flush=True)
            del reference
    return rows


# --------------------------------------------------------------------------- checkpoints


def part_checkpoints(args: argparse.Namespace, device: torch.device, work: Path) -> list[dict[str, Any]]:
    """Calls without and with checkpoints, alternating configurations in one process."""
    n, d = (args.n or 64009), (args.d or 64)
    x = harness.gaussian(n, d, args.seed).numpy()
    queries = x[:10000] + 0.01
    rows = []
    for op in ("graph", "search"):
        # A first call of each operation (compilation, caches) out of the timings.
        (knng.graph(x, args.ks[0], device=device) if op == "graph" else knng.search(queries, x, args.ks[0], device=device))
        for interval in (None, 60.0, 1.0, 0.0):
            folder = work / "ck"
            options = {} if interval is None else {"checkpoint": folder, "checkpoint_interval": interval}

            def call() -> Any:
                if op == "graph":
                    return knng.graph(x, args.ks[0], device=device, **options)
                return knng.search(queries, x, args.ks[0], device=device, **options)

            timing = harness.time_call(call, device=device, warmup=0, repeats=args.repeats,
                                       before=lambda: shutil.rmtree(folder, ignore_errors=True))
            saved = {f"checkpoint_{key}": value for key, value in dict(timing.result.report.checkpoints).items()}
            row = {"part": "checkpoints", "operation": op, "shape": [n, d], "k": args.ks[0], "interval_s": interval,
                   "seconds": timing.min, **timing.as_dict(), **saved}
            rows.append(row)
            print(f"checkpoints {op} {n:,} × {d} k={args.ks[0]} interval {interval}: min {timing.min:.3f} s; {saved}",
                  flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------ streamed


def make_file(path: Path, n: int, d: int, seed: int, device: torch.device) -> None:
    """Clustered float32 points (1,000 centres N(0, 4 I), unit noise), written block by block."""
    gen = torch.Generator(device=device).manual_seed(seed)
    centres = torch.randn(1000, d, device=device, generator=gen) * 2
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    for r0 in range(0, n, 65536):
        r1 = min(n, r0 + 65536)
        which = torch.randint(0, 1000, (r1 - r0,), device=device, generator=gen)
        out[r0:r1] = (centres[which] + torch.randn(r1 - r0, d, device=device, generator=gen)).cpu().numpy()
    out.flush()
    del out


def drop_cache(path: Path) -> None:
    """Drop the file's pages from the page cache, so that the next reads come from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_bandwidth(path: Path, block: int = 64 << 20) -> float:
    """Cold sequential read bandwidth of the file, bytes per second."""
    drop_cache(path)
    buf = bytearray(block)
    t0 = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(buf):
            total += got
    return total / (time.perf_counter() - t0)


def part_streamed(args: argparse.Namespace, device: torch.device, work: Path) -> list[dict[str, Any]]:
    """A graph streamed from disk under a host budget against the same graph in memory."""
    n, d, k = (args.n or 1_000_000), (args.d or 960), args.ks[0]
    folder = Path(args.dir) if args.dir else work
    path = folder / f"streamed_{n}x{d}_seed{args.seed}.npy"
    t0 = time.perf_counter()
    if not path.exists():
        make_file(path, n, d, args.seed, device)
    size = path.stat().st_size
    print(f"streamed: file {path}: {size / 1e9:.2f} GB ({time.perf_counter() - t0:.1f} s to write)", flush=True)
    bandwidth = read_bandwidth(path)
    print(f"streamed: cold sequential read {bandwidth / 1e9:.2f} GB/s ({size / bandwidth:.2f} s for the file)", flush=True)
    knng.graph(np.load(path, mmap_mode="r")[:min(n, 20000)], k, device=device)  # warm-up: context, kernels
    x = np.load(path)
    in_memory = harness.time_call(lambda x=x: knng.graph(x, k, device=device), device=device, warmup=0,
                                  repeats=1)
    g_mem, t_mem = in_memory.result, in_memory.min
    del x
    streamed = harness.time_call(lambda: knng.graph(np.load(path, mmap_mode="r"), k, device=device,
                                                    host_memory_budget=args.host_memory),
                                 device=device, warmup=0, repeats=1, before=lambda: drop_cache(path))
    g_str, t_str = streamed.result, streamed.min
    plan = g_str.report.plan
    identical = same(g_mem, g_str)
    reads = 2  # the corpus passes: finite check and centre, then the prepared copy
    read_s = reads * size / bandwidth
    hidden = 1 - max(0.0, t_str - t_mem) / read_s
    print(f"streamed: in memory {t_mem:.2f} s; streamed (host budget {args.host_memory}, reads of "
          f"{getattr(plan, 'read_rows', '?')} rows) {t_str:.2f} s = {t_str / t_mem:.3f}× in memory; identical "
          f"{identical}; {reads} passes of {size / 1e9:.2f} GB take {read_s:.2f} s at the cold bandwidth, "
          f"{hidden:.0%} hidden by the work", flush=True)
    if not args.dir:
        path.unlink()
    return [{"part": "streamed", "n": n, "d": d, "k": k, "file_gb": size / 1e9, "read_gbps": bandwidth / 1e9,
             "in_memory_s": t_mem, "streamed_s": t_str, "ratio": t_str / t_mem, "identical": identical,
             "hidden_share": hidden, "host_memory": args.host_memory, "read_rows": getattr(plan, "read_rows", None)}]


# ------------------------------------------------------------------------------- budgets


def warm_read_bandwidth(path: Path, block: int = 64 << 20) -> float:
    """Sequential read bandwidth of the file from the page cache (read once to warm, then timed)."""
    buf = bytearray(block)
    for timed in (False, True):
        t0 = time.perf_counter()
        total = 0
        with open(path, "rb", buffering=0) as f:
            while got := f.readinto(buf):
                total += got
        elapsed = time.perf_counter() - t0
    return total / elapsed


def plan_summary(result: Any) -> str:
    """Parts, part size, resident corpus, frames and precision of a graph's plan."""
    p = result.report.plan
    return (f"{p.parts} parts of {p.part_size}, {'resident' if p.corpus_resident else 'streamed'}, "
            f"{p.frames} frames, {p.screen_precision}, stores {p.lists}")


def part_budgets(args: argparse.Namespace, device: torch.device, work: Path) -> list[dict[str, Any]]:
    """One graph from every kind of input, with the default budget and under ``--budgets``."""
    if args.data == "gauss":
        n, d = args.n or 2_000_000, args.d or 128
        x, metric, label = harness.gaussian(n, d, args.seed).numpy(), "euclidean", f"gauss {n:,} × {d}"
    else:
        x, spec = harness.load_dataset(args.data, n=args.n, d=args.d, seed=args.seed, pictures=args.pictures)
        metric, label = spec.metric, args.data
    path = work / "x.npy"
    np.save(path, x)
    bandwidth = warm_read_bandwidth(path)
    size = path.stat().st_size
    print(f"budgets: {label}: file {size / 1e9:.2f} GB, page-cache read {bandwidth / 1e9:.2f} GB/s "
          f"({size / bandwidth:.2f} s)", flush=True)
    budgets = [None] + [b for b in args.budgets.split(",") if b]
    rows: list[dict[str, Any]] = []
    for k in args.ks:
        ways: dict[str, Any] = {}
        if device.type == "cuda":
            ways["tensor on the device"] = lambda: torch.from_numpy(x).to(device)
        ways["numpy in host memory"] = lambda: x
        ways["memory-mapped .npy"] = lambda: np.load(path, mmap_mode="r")
        reference = reference_s = None
        for budget in budgets:
            for way, source in ways.items():
                if budget is not None and way == "numpy in host memory":
                    continue
                options = {} if budget is None else {"memory_budget": budget}
                timing = harness.time_call(lambda: knng.graph(source(), k, metric=metric, device=device, **options),
                                           device=device, warmup=args.warmup, repeats=args.repeats)
                g = timing.result
                if reference is None:
                    reference, reference_s = g, timing.min
                row = {"part": "budgets", "data": label, "shape": list(x.shape), "k": k, "input": way,
                       "memory_budget": budget, **timing.as_dict(), "ratio": timing.min / reference_s,
                       "identical": same(g, reference), **harness.report_summary(g), "plan_shape": plan_summary(g)}
                rows.append(row)
                print(f"budgets k={k} {way:22} budget {budget or 'default':8}: min {timing.min:.3f} s "
                      f"({row['ratio']:.2f}×); {row['plan_shape']}; identical {row['identical']}", flush=True)
                del g, timing
                harness.release(device)
            out = work / "cli-out"
            times, done = command_line_graph(path, k, metric, device, out, args.repeats,
                                             [] if budget is None else ["--memory-budget", budget])
            if times:
                identical = bool(np.array_equal(np.load(out / "indices.npy"),
                                                np.asarray(torch.as_tensor(reference.indices).cpu())))
                bar = reference_s + size / bandwidth
                rows.append({"part": "budgets", "data": label, "shape": list(x.shape), "k": k,
                             "input": "command line (wall clock)", "memory_budget": budget, "times_s": times,
                             "min_s": min(times), "ratio": min(times) / reference_s,
                             "ratio_to_memory_plus_read": min(times) / bar, "identical_indices": identical})
                said = " | ".join(line.strip() for line in (done.stdout + done.stderr).splitlines()
                                  if "device" in line or "wrote" in line)
                print(f"budgets k={k} {'command line':22} budget {budget or 'default':8}: min {min(times):.3f} s "
                      f"({min(times) / reference_s:.2f}×; {min(times) / bar:.2f}× in-memory + page-cache read); "
                      f"identical indices {identical}; it said: {said}", flush=True)
        del reference
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.common_arguments(ap, repeats=2)
    ap.add_argument("--parts", default="inputs,checkpoints,streamed",
                    help="inputs, checkpoints, streamed, budgets (default: the first three)")
    ap.add_argument("--data", default="patches8", help="data set of the inputs part (default patches8)")
    ap.add_argument("--n", type=int, default=None, help="rows (inputs: of --data; checkpoints: 64,009; "
                    "streamed: 1,000,000)")
    ap.add_argument("--d", type=int, default=None, help="dimension (checkpoints: 64; streamed: 960)")
    ap.add_argument("--ks", default="10,100", help="k (inputs: each; the other parts: the first; default 10,100)")
    ap.add_argument("--budgets", default="4GB,512MB", help="budgets: memory budgets beside the default "
                    "(default 4GB,512MB)")
    ap.add_argument("--host-memory", default="1GB", help="streamed: the host-memory budget (default 1GB)")
    ap.add_argument("--dir", default=None, help="streamed: folder of the file on local disk, kept for the next run "
                    "(default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    harness.apply_threads(args)
    device = harness.resolve_device(args.device)
    args.ks = [int(k) for k in args.ks.split(",")]
    if args.quick:
        args.data, args.n, args.ks = "gauss", args.n or 3000, [10]
        args.d = args.d or 32
        args.host_memory = "256KB"
        args.repeats = args.repeats or 1
    args.repeats = args.repeats or 2
    args.warmup = 1 if args.warmup is None else args.warmup
    env = harness.environment(device)
    print(f"# {env['device']}, {env['date']}, torch {env['torch']}, knng {env['knng']}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="knng-bench-files-"))
    rows: list[dict[str, Any]] = []
    parts = {"inputs": part_inputs, "checkpoints": part_checkpoints, "streamed": part_streamed, "budgets": part_budgets}
    try:
        for name in args.parts.split(","):
            if name not in parts:
                ap.error(f"unknown part {name!r}; the parts are {', '.join(parts)}")
            rows += parts[name](args, device, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    harness.write_json(args.out, {**env, "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
