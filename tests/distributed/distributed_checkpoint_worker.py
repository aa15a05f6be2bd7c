"""Ranks of the distributed checkpoint tests (``test_distributed_checkpoints.py``), Gloo on the CPU.

``python distributed_checkpoint_worker.py WORLD PORT OUT SEED PHASE``: every rank runs a graph
and a search of the data made from SEED with their checkpoints in ``OUT/graph-ck`` and
``OUT/search-ck`` (``checkpoint_interval=0``: a save at every block row and query chunk), with
``resume=True`` when PHASE is ``resume``, and rank 0 saves the answers to ``OUT/PHASE.pkl``. A
crash is made by ``KNNG_TEST_CRASH_AT`` (``os._exit`` at a checkpoint step of every rank), or
in the search only by ``KNNG_TEST_SEARCH_CRASH_AT``.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: Query rows per search chunk here (the default, 65,536, would make one chunk of these queries).
QUERY_CHUNK = 16
#: ``KNNG_TEST_CRASH_AT`` for the search only, counted from its first step.
SEARCH_CRASH_ENV = "KNNG_TEST_SEARCH_CRASH_AT"


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(points, queries): clusters with exact duplicates (ties broken by index)."""
    rng = np.random.default_rng([seed, 13])
    centres = rng.standard_normal((12, 8)) * 3
    x = (centres[rng.integers(0, 12, 2500)] + rng.standard_normal((2500, 8))).astype(np.float32)
    x[2400:2440] = x[:40]
    q = np.concatenate([rng.standard_normal((50, 8)).astype(np.float32) * 3, x[:14]])
    return x, q


def main(rank: int, world: int, port: int, out: str, seed: int, phase: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch.distributed as dist

    import knng
    import knng.distributed as kd
    import knng.distributed.sharded as sharded

    sharded.QUERY_CHUNK = QUERY_CHUNK
    kd.init(device="cpu", timeout=60)
    tmp = Path(out)
    x, q = make_data(seed)
    resume = phase == "resume"
    results: dict[str, Any] = {}
    # A crash meant for the search starts counting its steps once the graph is done (whatever
    # number of block rows the graph's plan has).
    search_crash = os.environ.pop(SEARCH_CRASH_ENV, None)
    g = knng.graph(x, 6, device="cpu", distributed=True, memory_budget="4MB", checkpoint=tmp / "graph-ck",
                   resume=resume, checkpoint_interval=0)
    results["graph"] = (g.indices, g.distances, kd_report())
    if search_crash:
        from knng.io.workarea import CRASH_ENV

        os.environ[CRASH_ENV] = search_crash
    s = kd.search(q, x, 5, device="cpu", checkpoint=tmp / "search-ck", resume=resume, checkpoint_interval=0)
    results["search"] = (s.indices, s.distances, kd_report())
    if rank == 0:
        with open(tmp / f"{phase}.pkl", "wb") as f:
            pickle.dump(results, f)
    dist.destroy_process_group()


def kd_report() -> dict[str, Any]:
    from knng.api import last_report

    report = last_report()
    return {"checkpoints": report.checkpoints, "parts": getattr(report, "parts", None)}


def spawn(world: int, port: int, out: str, seed: int, phase: str) -> None:
    from distributed_worker import spawn_ranks

    spawn_ranks(main, (world, port, out, seed, phase), world)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    spawn(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])
