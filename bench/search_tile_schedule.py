"""How a search's corpus tiles are scheduled, and what that does to the pairs it screens (GPU).

A search seeds each row's threshold from a random sample of s columns, then screens the corpus
tile by tile; the store tightens between tiles. A tile of w columns screened against thresholds
that know C columns lets about k·w/C pairs per row through, so equal tiles of c columns let
about k·(c/s + 1 + 1/2 + 1/3 …) through, and tiles that double from s about k·log₂(n/s): at
k = 1,024 on 1M × 128 (s = 65,536, c = 262,144) about 5.8k against 4k per row. Schedules:

``fixed``     the engine's (equal tiles; the first tile's survivors tighten the rows at once)
``tighten``   equal tiles, every tile's survivors tightening the rows before the next
``doubling``  tiles from s columns, doubling up to c, every tile tightening the rows

Each runs ``knng.search`` with the schedule patched in (``knng.engine.search._screen_chunk``)
and prints the wall time (min of ``--calls``), pairs screened per row and exact evaluations per
row; every result is compared with the ``fixed`` schedule's (identical indices and distances).
Usage (GPU machine)::

    PYTHONPATH=src python bench/search_tile_schedule.py --ks 10,100,1024,2048 --precisions float32,tf32
"""

from __future__ import annotations

import argparse
import time

import torch

import knng
import knng.engine.search as search

ORIGINAL = search._screen_chunk


def widths(n: int, first: int, widest: int) -> list[tuple[int, int]]:
    """Tile ranges that start at ``first`` columns and double up to ``widest``."""
    out, c0, w = [], 0, first
    while c0 < n:
        out.append((c0, min(n, c0 + w)))
        c0, w = c0 + w, min(widest, 2 * w)
    return out


def patched(schedule: str):
    """A ``_screen_chunk`` screening its tiles in ``schedule`` (module globals reused)."""
    if schedule == "fixed":
        return ORIGINAL

    def screen_chunk(raw, pcorpus, sample, metric, k, plan_, cols_per_tile, select, device):
        # The engine's chunk screen up to its tile loop (see knng.engine.search._screen_chunk).
        prep = metric.prepare(raw, pcorpus.centre, side="query", symmetric=False, dtype=pcorpus.dtype)
        corpus = pcorpus.corpus
        errors = search.PairErrors(metric=metric, d=corpus.d, precision=plan_.precision, row_norms=prep.norms,
                                   row_terms=None, row_offsets=prep.offsets, col_norms=pcorpus.norms,
                                   col_terms=pcorpus.terms, centre_norm=pcorpus.centre_norm)

        def evaluate(rows, cols):
            return search.exact_pairs(metric, raw, rows, corpus, cols, device, plan_.work_bytes)

        st = search.CandidateStore(raw.shape[0], k, plan_.capacity, errors, evaluate, device,
                                   pending=plan_.pending_pairs, work_bytes=plan_.work_bytes)
        rows = torch.arange(raw.shape[0], device=device)
        search._seed_from_sample(st, raw, prep, pcorpus, sample, metric, k, select, device)
        terms = pcorpus.terms32
        ranges = (widths(corpus.n, sample.columns.numel(), cols_per_tile) if schedule == "doubling"
                  else [(c0, min(corpus.n, c0 + cols_per_tile)) for c0 in range(0, corpus.n, cols_per_tile)])
        for c0, c1 in ranges:
            maxima = pcorpus.maxima(c0, c1)
            found = search.screen_rows(prep.vectors, pcorpus.tile(c0, c1), corpus.d,
                                       st.screen_thresholds(rows, *maxima), plan_.precision,
                                       col_terms=None if terms is None else terms[c0:c1])
            if c1 < corpus.n:
                st.tighten(found.owner, found.keys, *maxima)
            st.add(found.owner, found.other + c0, found.keys)
        return st

    return screen_chunk


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--ks", default="10,100,1024,2048")
    ap.add_argument("--precisions", default="float32,tf32")
    ap.add_argument("--schedules", default="fixed,tighten,doubling")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the schedules")
    args = ap.parse_args()
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((args.n, args.d), device=dev, generator=gen)
    q = torch.randn((args.queries, args.d), device=dev, generator=gen)
    print("| precision | k | schedule | ms (min) | screened per row (median / p99) | evaluated per row (median) |")
    print("|---|---|---|---|---|---|")
    for precision in args.precisions.split(","):
        knng.options(screen_precision=precision).__enter__()  # for the rest of the process
        for k in (int(v) for v in args.ks.split(",")):
            reference = None
            for schedule in args.schedules.split(","):
                search._screen_chunk = patched(schedule)
                result = knng.search(q, x, k)
                times = []
                for _ in range(args.calls):
                    sync(dev)
                    t0 = time.perf_counter()
                    result = knng.search(q, x, k)
                    sync(dev)
                    times.append(1e3 * (time.perf_counter() - t0))
                if reference is None:
                    reference = result
                same = (torch.equal(result.indices, reference.indices)
                        and torch.equal(result.distances, reference.distances))
                rep = result.report
                print(f"| {precision} | {k} | {schedule}{'' if same else ' (DIFFERS)'} | {min(times):.1f} | "
                      f"{rep.screened_per_row.get('median', 0):.0f} / {rep.screened_per_row.get('p99', 0):.0f} | "
                      f"{rep.evaluations_per_row.get('median', 0):.0f} |", flush=True)
            search._screen_chunk = ORIGINAL


if __name__ == "__main__":
    main()
