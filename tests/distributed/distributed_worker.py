"""The distributed test battery: run by ``test_distributed.py`` in W processes (Gloo, CPU).

Every rank runs every scenario with the same data (made from the seed, the same way the test
process makes it), catches what it raises, and rank 0 (or every rank, for scenarios whose point
is what each rank sees) saves the results to ``OUT/rank<r>.pkl``. The test process compares them
with the single-device engine and the float64 oracle. One process group serves the whole
battery, since starting one costs seconds on a small CPU.

Usage: ``python distributed_worker.py WORLD PORT OUT SEED [DEVICE]`` (DEVICE cpu (Gloo, the default) or
cuda (NCCL, rank r on GPU r)).
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

GRAPH_METRICS = ("euclidean", "sqeuclidean", "cosine", "pearson", "inner_product")
#: Where the ranks compute (set from the command line).
DEVICE = ["cpu"]


def make_data(name: str, seed: int, tmp: Path | None = None) -> Any:
    """The inputs of scenario ``name`` (deterministic in ``seed``)."""
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    if name == "offset":  # far from the origin: the float32 expansion fails here
        return rng.normal(1000.0, 1.0, (211, 9)).astype(np.float32)
    if name == "normal":
        return rng.standard_normal((397, 7))
    if name == "float32_screen":  # 8·k·d < n on a CPU: a float32 screen and its certificate
        return rng.standard_normal((3001, 5)).astype(np.float32)
    if name == "duplicates":  # rows 0..4 with 30 copies each: certificate failures, the refine
        base = rng.standard_normal((60, 10)).astype(np.float32)
        x = np.concatenate([base] + [base[:5]] * 30)
        return x[rng.permutation(len(x))]
    if name == "integer_ties":
        return rng.integers(0, 3, size=(300, 3)).astype(np.int8)
    if name == "flat":  # a flat image region's patches: groups that fold (see knng.engine.duplicates)
        x = rng.standard_normal((300, 8)).astype(np.float32)
        x = np.concatenate([x, np.repeat(x[:1], 120, axis=0), np.repeat(x[1:2], 40, axis=0)])
        return x[rng.permutation(len(x))]
    if name == "grey":  # image patches' grey levels / 255: a lattice, screened with exact products
        levels = rng.integers(0, 256, size=(500, 16))
        levels[:40] = levels[:40, :1]  # flat patches of one level each
        return (levels / 255).astype(np.float32)
    if name == "pixels":  # uint8 rows of d = 128: the planner screens them as integer rows (int8)
        x = rng.integers(0, 256, size=(400, 128)).astype(np.uint8)
        x[50:80] = x[3]  # duplicates
        x[100:140] = 17  # flat rows
        return x
    if name == "identical":
        return np.tile(rng.standard_normal((1, 7)), (50, 1)).astype(np.float32)
    if name == "wide":
        return rng.normal(3.0, 1.0, (400, 64)).astype(np.float32)
    if name == "small":
        return rng.standard_normal((5, 3))
    if name == "search-flat":
        corpus = make_data("flat", seed)
        return np.concatenate([rng.standard_normal((30, 8)), corpus[:10]]).astype(np.float32), corpus
    if name == "search":
        corpus = rng.normal(100.0, 1.0, (1201, 6)).astype(np.float32)
        corpus[1000:1100] = corpus[:100]  # duplicates across shards
        queries = np.concatenate([rng.normal(100.0, 1.0, (40, 6)), corpus[:20]]).astype(np.float32)
        return queries, corpus
    raise KeyError(name)


def _graph_case(data: str, k: int, metric: str = "euclidean", **kw: Any) -> dict[str, Any]:
    return {"kind": "graph", "data": data, "k": k, "metric": metric, "kw": kw}


#: name → what to run. The test module reads the same table.
CASES: dict[str, dict[str, Any]] = {
    **{f"graph-normal-{m}": _graph_case("normal", 12, m) for m in GRAPH_METRICS},
    **{f"graph-f32-{m}": _graph_case("float32_screen", 3, m) for m in ("euclidean", "cosine", "inner_product")},
    "graph-offset-k1": _graph_case("offset", 1),
    "graph-offset-k10": _graph_case("offset", 10),
    "graph-offset-kmax": _graph_case("offset", 210),
    **{f"graph-dups-{m}": _graph_case("duplicates", 12, m, memory_budget="64KB") for m in ("euclidean", "cosine")},
    # Unfolded, the duplicates' near-ties overflow the stores (folded, they are one row each).
    "graph-dups-f32": {**_graph_case("duplicates", 3, "euclidean"), "options": {"fold_duplicates": False}},
    "graph-int-ties": _graph_case("integer_ties", 30, "sqeuclidean", memory_budget="200KB"),
    # The digit screen (int8 rows with their scales travel between ranks), forced.
    **{f"graph-digits-{m}": {**_graph_case("offset", 7, m, memory_budget="64KB"), "precision": "int8x4"}
       for m in ("euclidean", "inner_product")},
    "graph-digits-dups": {**_graph_case("duplicates", 12, "cosine", memory_budget="64KB"), "precision": "int8x4"},
    "graph-identical-self": _graph_case("identical", 50, "euclidean", include_self=True),
    "graph-identical": _graph_case("identical", 49, "cosine"),
    "graph-small": _graph_case("small", 4, "euclidean"),
    # Groups of identical rows, folded into one and unfolded after, as on one device.
    "graph-flat": _graph_case("flat", 10, "euclidean"),
    "graph-flat-self": _graph_case("flat", 10, "sqeuclidean", include_self=True),
    "graph-flat-cosine": _graph_case("flat", 12, "cosine", memory_budget="64KB"),
    "graph-flat-memmap": {**_graph_case("flat", 7), "input": "memmap"},
    "graph-one-group": _graph_case("identical", 5, "euclidean"),
    # Grey levels / 255 under the scaled float16 screen: exact products around a lattice point.
    "graph-lattice": {**_graph_case("grey", 8, "euclidean"), "precision": "float16"},
    "graph-lattice-sq": {**_graph_case("grey", 30, "sqeuclidean", memory_budget="64KB"), "precision": "float16"},
    # Rows of 120 and 40 identical points, not folded, hold more survivors than escalate_pairs:
    # escalated (τ = −∞ merged across the ranks) and searched again, as a GPU's hard rows are.
    "graph-escalated": {**_graph_case("flat", 10, "euclidean"), "precision": "tf32",
                        "options": {"hold_on": frozenset({"cpu", "cuda"}), "cpu_max_part": 70, "pending_cpu": 300,
                                    "escalate_pairs": 12, "fold_duplicates": False}},
    # uint8 data of d = 128: integer rows, chosen by rank 0's planner (on a CPU from d = 128).
    "graph-integer-rows": _graph_case("pixels", 10, "euclidean", memory_budget="64KB"),
    "search-flat": {"kind": "search", "k": 15, "metric": "euclidean", "data": "search-flat"},
    "search-flat-memmap": {"kind": "search", "k": 100, "metric": "cosine", "data": "search-flat", "input": "memmap"},
    "graph-tiny-budget": _graph_case("normal", 5, "euclidean", memory_budget="16KB"),
    # Budgets that keep the owned columns as read (prepared per block), or not at all. They are
    # sized for float32 rows: on a GPU, where the planner may screen small-k graphs in float16
    # (rows of half the bytes), the screen stays float32 so that the same tiers are exercised.
    "graph-columns-raw": {**_graph_case("wide", 5, "euclidean", memory_budget="160KB"), "gpu_precision": "float32"},
    "graph-columns-read": {**_graph_case("wide", 5, "cosine", memory_budget="90KB"), "gpu_precision": "float32"},
    "graph-memmap": {**_graph_case("offset", 7), "input": "memmap"},
    "graph-h5py": {**_graph_case("normal", 6, "cosine"), "input": "h5py"},
    "search-k1": {"kind": "search", "k": 1, "metric": "euclidean"},
    "search-k10": {"kind": "search", "k": 10, "metric": "euclidean"},
    "search-cosine": {"kind": "search", "k": 25, "metric": "cosine"},
    "search-ip": {"kind": "search", "k": 5, "metric": "inner_product"},
    "search-all": {"kind": "search", "k": 1201, "metric": "sqeuclidean"},
    "search-memmap": {"kind": "search", "k": 9, "metric": "euclidean", "input": "memmap"},
    "search-root-queries": {"kind": "search", "k": 4, "metric": "cosine", "root_queries": True},
    "graph-api-flag": {**_graph_case("offset", 3, "euclidean"), "api": True},
    "search-api-flag": {"kind": "search", "k": 3, "metric": "euclidean", "api": True},
    "files": {**_graph_case("offset", 5), "kind": "files"},
    "files-flat": {**_graph_case("flat", 9), "kind": "files"},
    # Too small a budget for the representatives' graph gathered on every rank: not folded.
    "files-flat-budget": {**_graph_case("flat", 9, memory_budget="64KB"), "kind": "files"},
    "nan": {"kind": "nan"},
    "mismatch": {"kind": "mismatch"},
}


def _as_input(x: np.ndarray, how: str | None, tmp: Path, tag: str) -> Any:
    if how == "memmap":
        path = tmp / f"{tag}.npy"
        if not path.exists():
            np.save(path, x)
        return np.load(path, mmap_mode="r")
    if how == "h5py":
        import h5py

        path = tmp / f"{tag}.h5"
        if not path.exists():
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=x)
        return h5py.File(path, "r")["x"]
    return x


def run_case(name: str, case: dict[str, Any], rank: int, world: int, seed: int, tmp: Path) -> dict[str, Any]:
    import knng

    forced = case.get("precision") or (case.get("gpu_precision") if DEVICE[0] != "cpu" else None)
    options = dict(case.get("options", {}), **({} if forced is None else {"screen_precision": forced}))
    with knng.options(**options):
        return _run_case(name, case, rank, world, seed, tmp)


def _run_case(name: str, case: dict[str, Any], rank: int, world: int, seed: int, tmp: Path) -> dict[str, Any]:
    import knng.distributed as kd
    from knng.api import last_report

    kind = case["kind"]
    if kind in ("graph", "files"):
        x = make_data(case["data"], seed)
        data = _as_input(x, case.get("input"), tmp, f"{name}-r{rank}")
        if kind == "files":
            report = kd.graph_to_files(data, case["k"], tmp / f"{name}-out", metric=case["metric"],
                                       device=DEVICE[0], metadata={"case": name}, **case["kw"])
            return {"report": report.world, "duplicates_folded": report.duplicates_folded}
        if case.get("api"):  # the same through knng.graph(..., distributed=True)
            import knng

            g = knng.graph(data, case["k"], metric=case["metric"], device=DEVICE[0], distributed=True, **case["kw"])
        else:
            g = kd.graph(data, case["k"], metric=case["metric"], device=DEVICE[0], **case["kw"])
        report = last_report()
        return {"indices": g.indices, "distances": g.distances, "parts": report.parts, "method": report.method,
                "resident": None if report.plan is None else report.plan.corpus_resident,
                "group": 1 if report.plan is None else report.plan.group_parts,
                "duplicates_folded": report.duplicates_folded, "exact_products": report.exact_products,
                "stages": sorted(report.stages),
                "precision": getattr(report.screen_dtype, "name", report.screen_dtype),
                "tightenings": report.store.tightenings, "overflow": report.store.overflow_rows,
                "rows_escalated": report.rows_escalated,
                "per_rank_blocks": [r["blocks"] for r in report.per_rank]}
    if kind == "search":
        queries, corpus = make_data(case.get("data", "search"), seed)
        corpus = _as_input(corpus, case.get("input"), tmp, f"{name}-r{rank}")
        if case.get("root_queries") and rank != 0:
            queries = None  # rank 0 sends them
        if case.get("api"):
            import knng

            r = knng.search(queries, corpus, case["k"], metric=case["metric"], device=DEVICE[0], distributed=True)
        else:
            r = kd.search(queries, corpus, case["k"], metric=case["metric"], device=DEVICE[0])
        return {"indices": r.indices, "distances": r.distances, "stages": sorted(last_report().stages),
                "duplicates_folded": last_report().duplicates_folded}
    if kind == "nan":
        x = make_data("normal", seed).copy()
        x[301, 2] = np.nan  # in one rank's part only
        kd.graph(x, 3, device=DEVICE[0])
        return {}
    if kind == "mismatch":
        x = make_data("normal", seed)
        kd.graph(x[: len(x) - (rank == world - 1)], 3, device=DEVICE[0])
        return {}
    raise KeyError(kind)


def main(rank: int, world: int, port: int, out: str, seed: int, device: str = "cpu") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch.distributed as dist

    import knng.distributed as kd

    DEVICE[0] = device
    kd.init(device=device, timeout=60)
    tmp = Path(out)
    results: dict[str, Any] = {}
    for name, case in CASES.items():
        try:
            results[name] = run_case(name, case, rank, world, seed, tmp)
        except Exception as exc:  # noqa: BLE001 - the test looks at what each rank raised
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    with open(tmp / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(results, f)
    dist.destroy_process_group()


def spawn_ranks(entry: Callable[..., None], args: tuple, world: int) -> None:
    """Run ``entry(rank, *args)`` in ``world`` processes that share this host's cores.

    Each rank gets its share of the cores for torch's threads (as ``knng.distributed.launch``
    gives its ranks): with every core each, the ranks' threads spin against each other, and a
    small matrix product on 2 busy cores took 12 ms instead of 44 µs.
    """
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    mp.spawn(entry, args=args, nprocs=world)


def spawn(world: int, port: int, out: str, seed: int, device: str = "cpu", entry: Callable[..., None] = main) -> None:
    spawn_ranks(entry, (world, port, out, seed, device), world)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    spawn(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])
