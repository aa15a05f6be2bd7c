"""A GPU search's (or graph by rows') stages with its tiles first (``search._screen_tiles_first``)
against the sample path, timed inside the first query chunk of one call, then whole calls of both
alternating in one process. Usage (GPU machine)::

    PYTHONPATH=src python bench/tiles_first_rates.py [--n 200000] [--d 128] [--k 100] [--warps 1,4]
    PYTHONPATH=src python bench/tiles_first_rates.py --queries 10000 --n 500000 --k 100

Without ``--queries`` the call is ``knng.graph(x, k)`` (by rows from k = 64); with it
``knng.search``. Stage times are CUDA-synchronised minima of 3; every answer of the tiles-first
stages is checked equal to the sample path's."""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import knng
import knng.engine.search as search
from knng.engine import fused, preparation, screen, thresholds
from knng.engine.exact import exact_pairs
from knng.engine.store import CandidateStore, Holding, PairErrors


def timed(fn, reps=3):
    out, best = None, float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) * 1e3)
    return out, best


def spread(x: torch.Tensor) -> str:
    x = x.double()
    return f"median {x.median().item():.0f}, p99 {x.quantile(0.99).item():.0f}, max {x.max().item():.0f}"


def stages(warps: list[int]):
    original = search._screen_chunk
    done = []

    def measured(raw, pcorpus, sample, metric, k, plan, cols_per_tile, select, device):
        if done or sample is not None:
            return original(raw, pcorpus, sample, metric, k, plan, cols_per_tile, select, device)
        done.append(1)
        prep = preparation.prepare(metric, raw, pcorpus.centre, side="query", symmetric=False, dtype=pcorpus.dtype)
        corpus, m, precision = pcorpus.corpus, raw.shape[0], plan.precision
        errors = PairErrors(metric=metric, d=corpus.d, precision=precision, row_norms=prep.norms, row_terms=None,
                            row_offsets=prep.offsets, col_norms=pcorpus.norms, col_terms=pcorpus.terms,
                            centre_norm=pcorpus.centre_norm)

        def store():
            return CandidateStore(m, k, plan.capacity, errors,
                                  lambda r, c: exact_pairs(metric, raw, r, corpus, c, device, plan.work_bytes), device,
                                  pending=plan.pending_pairs, work_bytes=plan.work_bytes, holding=Holding())

        rows = torch.arange(m, device=device)
        vectors, terms, maxima = pcorpus.resident, pcorpus.terms32, pcorpus.maxima(0, corpus.n)
        print(f"chunk of {m} rows, {corpus.n} columns, precision {precision.name}, k = {k}")
        keys, t_min = timed(lambda: screen.tile_minima(prep.vectors, vectors, corpus.d, precision, col_terms=terms))
        print(f"tile minima {tuple(keys.shape)}: {t_min:.2f} ms")
        for w in warps:
            thresholds.KTH_WIDE_WARPS = w
            ends, t_kth = timed(lambda: thresholds.kth_of_rows(keys, k))
            print(f"k-th of each row's tile minima, {w} warps: {t_kth:.2f} ms")
        st = store()
        st.tighten_ends(*ends, *maxima, counted=False)
        thr = st.screen_thresholds(rows, *maxima)
        thr32 = thr.float()
        passed = keys <= thr32[:, None]
        print(f"tiles within the threshold per row: {spread(passed.sum(1))}")
        (tiles, prow), t_grp = timed(lambda: torch.nonzero((keys <= thr32[:, None]).T, as_tuple=True))
        print(f"(row, tile) pairs {tiles.numel():,} ({tiles.numel() / m:.1f} a row); torch.nonzero would group "
              f"them in {t_grp:.2f} ms")
        del tiles, prow
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fused.screen_tiles(prep.vectors, vectors, corpus.d, keys, thr32, None, terms, precision.name, 2 * k * m)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=50))
        found, t_gs = timed(lambda: screen.screen_tiles(prep.vectors, vectors, corpus.d, keys, thr, precision,
                                                        col_terms=terms))
        print(f"screen_tiles (grouping, items, gathered kernel): {t_gs:.2f} ms; survivors a row "
              f"{spread(torch.bincount(found.owner, minlength=m))}")
        whole, t_full = timed(lambda: screen.screen_rows(prep.vectors, vectors, corpus.d, thr, precision,
                                                         col_terms=terms))
        same = torch.equal(torch.sort(found.owner * corpus.n + found.other).values,
                           torch.sort(whole.owner * corpus.n + whole.other).values)
        print(f"full screen at the same thresholds: {t_full:.2f} ms, {whole.owner.numel():,} pairs; same pairs: {same}")

        def tail():
            s = store()
            s.tighten_ends(*ends, *maxima, counted=False)
            s.add(found.owner, found.other, found.keys)
            s.tighten_held(maxima)
            return s.finish()

        _, t_tail = timed(tail, 2)
        print(f"seeds' tightening, held survivors' tightening and finish: {t_tail:.2f} ms")
        return original(raw, pcorpus, None, metric, k, plan, cols_per_tile, select, device)

    search._screen_chunk = measured
    return lambda: search.__setattr__("_screen_chunk", original)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--queries", type=int, default=0)
    ap.add_argument("--warps", default="4")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((args.n, args.d), device="cuda", generator=gen)
    q = torch.randn((args.queries, args.d), device="cuda", generator=gen) if args.queries else None

    def call():
        return knng.search(q, x, args.k) if q is not None else knng.graph(x, args.k)

    warps = [int(w) for w in args.warps.split(",")]
    restore = stages(warps)
    call()
    restore()
    thresholds.KTH_WIDE_WARPS = warps[-1]
    times = {True: [], False: []}
    answers = {}
    for first in (True, False):  # warm-up of each
        with knng.options(tiles_first=first):
            answers[first] = call()
    for _ in range(args.repeats):
        for first in (True, False):
            with knng.options(tiles_first=first):
                _, t = timed(call, 1)
            times[first].append(t)
    same = (torch.equal(torch.as_tensor(answers[True].indices), torch.as_tensor(answers[False].indices))
            and torch.equal(torch.as_tensor(answers[True].distances), torch.as_tensor(answers[False].distances)))
    what = f"search {args.queries} × {args.n} × {args.d}" if q is not None else f"graph {args.n} × {args.d}"
    print(f"{what}, k = {args.k}: tiles first {min(times[True]):.1f} ms {[round(t, 1) for t in times[True]]}, "
          f"sample path {min(times[False]):.1f} ms {[round(t, 1) for t in times[False]]}; same answers: {same}")


if __name__ == "__main__":
    main()
