"""Benchmark k-NN classification: knng's KNeighborsClassifier vs scikit-learn vs torch.

Task: classify ``--queries`` points (default 100 000) by their ``--k`` (10) nearest neighbours
among ``--train`` labelled points (1 000 000 × 128, float32), drawn from ``--classes``
Gaussian classes (class means N(0, sep²·I), points mean + N(0, I)).

Contestants, all in this process on this machine:

- **knng**: ``knng.estimators.KNeighborsClassifier`` fitted on torch tensors on the compute
  device (the GPU when there is one), ``predict`` on torch query tensors; exact neighbours,
  votes counted on the host.
- **scikit-learn**: ``sklearn.neighbors.KNeighborsClassifier(algorithm="brute", n_jobs=-1)``
  on the CPU with NumPy arrays. It is slow, so only the first ``--sklearn-queries`` (2 000)
  queries are timed, once, and the time is **scaled linearly** to all queries (the table says
  so). Brute force is linear in the number of queries, so the scaling is fair.
- **torch**: what most GPU code does: the float32 expansion ‖y‖² − 2xᵀy with ``addmm`` in
  query chunks, ``torch.topk``, then a vote with ``scatter_add`` — on the same device as knng,
  not exact (the agreement column shows how often its labels equal knng's).

Times: ``harness.time_call`` (CUDA events on a GPU, the host clock on a CPU), a warm-up call,
then the median of ``--repeats`` (each call includes moving labels to the host). Prints a
markdown table with the device, the date and the command, and writes JSON (``--out``).

Usage (from the repository root)::

    PYTHONPATH=src:tests python bench/bench_classifier.py --out classifier.json     # the full shape, on a GPU
    PYTHONPATH=src:tests python bench/bench_classifier.py --quick                   # small shapes, CPU smoke run
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import sklearn
import torch
from sklearn.neighbors import KNeighborsClassifier as SkKNeighborsClassifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from knng.estimators import KNeighborsClassifier  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int, device: torch.device, warmup: bool = True) -> tuple[list[float], Any]:
    """``harness.time_call``: one warm-up call (unless not ``warmup``), then ``repeats`` timed ones (seconds)."""
    timing = harness.time_call(fn, device=device, warmup=1 if warmup else 0, repeats=repeats)
    return timing.times, timing.result


def make_data(n_train: int, n_queries: int, d: int, n_classes: int, sep: float, seed: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gaussian classes: (X_train, y_train, X_query, y_query), float32 / int64 on ``device``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    means = (torch.randn(n_classes, d, generator=g) * sep).to(device)
    gd = torch.Generator(device=device).manual_seed(seed + 1)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, n_classes, (n,), generator=gd, device=device)
        x = torch.randn(n, d, generator=gd, device=device) + means[y]
        return x.float(), y

    X, y = draw(n_train)
    Q, yq = draw(n_queries)
    return X, y, Q, yq


def torch_classify(Q: torch.Tensor, X: torch.Tensor, y: torch.Tensor, k: int, n_classes: int,
                   weights: str, chunk: int) -> torch.Tensor:
    """Baseline: float32 expansion + topk + (weighted) vote, in query chunks; labels on host."""
    xn = (X * X).sum(1)
    out = torch.empty(Q.shape[0], dtype=torch.int64, device=Q.device)
    for s in range(0, Q.shape[0], chunk):
        q = Q[s:s + chunk]
        scores = torch.addmm(xn, q, X.T, alpha=-2.0)  # ‖y‖² − 2xᵀy; ‖x‖² added after top-k
        val, idx = torch.topk(scores, k, dim=1, largest=False)
        if weights == "uniform":
            w = torch.ones_like(val)
        else:
            sq = (val + (q * q).sum(1, keepdim=True)).clamp_min(1e-30)
            w = 1.0 / sq if weights == "inverse_square" else 1.0 / sq.sqrt()
        votes = torch.zeros(q.shape[0], n_classes, device=Q.device, dtype=w.dtype)
        votes.scatter_add_(1, y[idx], w)
        out[s:s + chunk] = votes.argmax(1)
    return out.cpu()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=1_000_000, help="labelled points")
    ap.add_argument("--queries", type=int, default=100_000, help="points to classify")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--sep", type=float, default=0.35, help="spread of the class means")
    ap.add_argument("-k", "--k", type=int, default=10)
    ap.add_argument("--weights", choices=["uniform", "distance", "inverse_square"], default="uniform")
    ap.add_argument("--sklearn-queries", type=int, default=2000,
                    help="queries timed for scikit-learn (time scaled to --queries); 0 skips it")
    ap.add_argument("--device", default="auto", help="knng / torch device: auto, cpu, cuda, cuda:N")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=1024, help="query chunk of the torch baseline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 20k×32 training points, 2k queries, 500 for scikit-learn")
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default torch's; 1 with --quick)")
    ap.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.quick:
        args.train, args.queries, args.dim, args.sklearn_queries, args.repeats = 20_000, 2_000, 32, 500, 2
    harness.apply_threads(args)

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    X, y, Q, yq = make_data(args.train, args.queries, args.dim, args.classes, args.sep, args.seed, device)
    y_host, yq_host = y.cpu().numpy(), yq.cpu().numpy()
    rows: list[dict[str, Any]] = []

    # knng ---------------------------------------------------------------------------------
    clf = KNeighborsClassifier(n_neighbors=args.k, weights=args.weights, device=device).fit(X, y_host)
    times, pred_knng = timed(lambda: clf.predict(Q), args.repeats, device)
    t = statistics.median(times)
    rows.append(dict(method="knng KNeighborsClassifier (exact)", device=device_name(device),
                     queries_timed=args.queries, seconds=t, seconds_all_queries=t, scaled=False,
                     times=times, accuracy=float(np.mean(pred_knng == yq_host)), agreement=1.0))

    # torch baseline -------------------------------------------------------------------------
    times, pred_torch = timed(
        lambda: torch_classify(Q, X, y, args.k, args.classes, args.weights, args.chunk).numpy(),
        args.repeats, device)
    t = statistics.median(times)
    rows.append(dict(method="torch addmm + topk + vote (float32, not exact)", device=device_name(device),
                     queries_timed=args.queries, seconds=t, seconds_all_queries=t, scaled=False,
                     times=times, accuracy=float(np.mean(pred_torch == yq_host)),
                     agreement=float(np.mean(pred_torch == pred_knng))))

    # scikit-learn on the CPU, a subset of queries, scaled -----------------------------------
    if args.sklearn_queries > 0:
        m = min(args.sklearn_queries, args.queries)
        X_np = X.cpu().numpy()
        Q_np = Q[:m].cpu().numpy()
        sk = SkKNeighborsClassifier(n_neighbors=args.k, weights=args.weights if args.weights != "inverse_square"
                                    else (lambda d: 1.0 / np.maximum(d, 1e-30) ** 2),
                                    algorithm="brute", n_jobs=-1).fit(X_np, y_host)
        times, pred_sk = timed(lambda: sk.predict(Q_np), 1, torch.device("cpu"), warmup=False)
        t = times[0]
        rows.append(dict(method="scikit-learn KNeighborsClassifier(algorithm='brute', n_jobs=-1)",
                         device=device_name(torch.device("cpu")), queries_timed=m, seconds=t,
                         seconds_all_queries=t * args.queries / m, scaled=m < args.queries,
                         times=times, accuracy=float(np.mean(pred_sk == yq_host[:m])),
                         agreement=float(np.mean(pred_sk == pred_knng[:m]))))

    # report -----------------------------------------------------------------------------------
    command = "PYTHONPATH=src python " + " ".join([sys.argv[0]] + (sys.argv[1:] if argv is None else argv))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    knng_time = rows[0]["seconds_all_queries"]
    print(f"## k-NN classification: {args.queries:,} queries, {args.train:,} × {args.dim} training points, "
          f"{args.classes} classes, k = {args.k}, weights = {args.weights}\n")
    print(f"- device: {device_name(device)}; host: {platform.node()} ({os.cpu_count()} CPU threads)")
    print(f"- date: {date}; torch {torch.__version__}, scikit-learn {sklearn.__version__}")
    print(f"- command: `{command}`")
    print(f"- times: median of {args.repeats} after a warm-up, except scikit-learn (one run on the "
          f"first {args.sklearn_queries:,} queries, scaled linearly to {args.queries:,})\n")
    print("| method | device | queries timed | time for all queries (s) | queries/s | × knng time "
          "| accuracy | label agreement with knng |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        scaled = " (scaled)" if r["scaled"] else ""
        print(f"| {r['method']} | {r['device']} | {r['queries_timed']:,} | {r['seconds_all_queries']:.3f}{scaled} "
              f"| {args.queries / r['seconds_all_queries']:,.0f} | {r['seconds_all_queries'] / knng_time:.2f} "
              f"| {r['accuracy']:.4f} | {r['agreement']:.4f} |")
    meta = dict(benchmark="classifier", date=date, command=command, device=device_name(device),
                host=platform.node(), cpu_threads=os.cpu_count(), torch=torch.__version__,
                sklearn=sklearn.__version__, python=platform.python_version(),
                config={key: value for key, value in vars(args).items()}, rows=rows)
    harness.write_json(args.out, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
