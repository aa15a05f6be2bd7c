"""Writing a distributed result: every rank its own rows, into files that appear only when complete.

Rank 0 locks the output folder and creates ``indices.npy`` and ``distances.npy`` in its staging
copy beside it (which every rank must see: a shared file system across hosts), every rank writes
the rows it owns into them through a memory map, and only when every rank has flushed its rows
does rank 0 add ``knng.json`` and commit the set (:class:`knng.io.OutputFolder`: one atomic
switch of the whole folder). A rank that fails before that leaves the folder as it was: rank 0's
wait fails, the staging copy is removed, and the folder never holds a half-written set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from knng.distributed.comm import Comm
from knng.distributed.graph_shares import RankRows
from knng.io import NEIGHBOR_FILES, OutputFolder, ResultSet, metadata_json

__all__ = ["write_rows"]


def write_rows(rows: RankRows, n: int, k: int, comm: Comm, out: Path, metadata: dict[str, Any],
               overwrite: bool) -> None:
    """Write every rank's rows of an (n, k) result to ``out``; collective (every rank calls it)."""
    text = metadata_json(metadata)
    if comm.rank != 0:
        comm.barrier("the creation of the output files by rank 0")
        names = json.loads(comm.store.get("output/temps").decode("utf-8"))
        _write_own(rows, names[0], names[1], comm)
        comm.barrier("the writing of every rank's rows")
        comm.barrier("the final rename by rank 0")
        return
    # If any rank fails inside, a barrier raises here and the folder removes its staging copy.
    with OutputFolder(out, overwrite=overwrite, expected_bytes=n * k * 12 + len(text)) as folder:
        results = ResultSet(folder)
        temps = [str(results.add_empty_array(NEIGHBOR_FILES["indices"], (n, k), np.int64)),
                 str(results.add_empty_array(NEIGHBOR_FILES["distances"], (n, k), np.float32))]
        comm.store.set("output/temps", json.dumps(temps))
        comm.barrier("the creation of the output files by rank 0")
        _write_own(rows, temps[0], temps[1], comm)
        comm.barrier("the writing of every rank's rows")
        results.commit_text(text)
    comm.barrier("the final rename by rank 0")


def _write_own(rows: RankRows, indices_path: str, distances_path: str, comm: Comm) -> None:
    comm.status("writing its rows of the output")
    idx_map = np.load(indices_path, mmap_mode="r+")
    dist_map = np.load(distances_path, mmap_mode="r+")
    for (a, b), idx, dist in zip(rows.parts, rows.indices, rows.distances):
        idx_map[a:b] = idx.cpu().numpy()
        dist_map[a:b] = dist.cpu().numpy().astype(np.float32)  # float64 rounded to nearest, as knng.graph does
    idx_map.flush()
    dist_map.flush()
    for path in (indices_path, distances_path):
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
    del idx_map, dist_map
