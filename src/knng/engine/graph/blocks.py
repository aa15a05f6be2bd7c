"""The steps of the symmetric graph, block by block: what every block loop runs.

A part's own block S(I, I) seeds its points' thresholds and is screened against them
(:func:`screen_own_part`, or all parts' own blocks in one launch: :func:`screen_own_parts_together`);
an off-diagonal block S(I, J), I < J, is screened once for both sides
(:func:`off_diagonal_blocks`: row candidates for part I, column candidates for part J, each
tested against its point's threshold, shared by every block where the blocks share one centre:
:class:`SharedThresholds`). The loops that order these steps are :mod:`.symmetric` (stores on
the device) and :mod:`.bands` (stores in host memory or on disk, a band of parts at a time);
the distributed graph screens its own blocks with :func:`screen_own_part`.
"""

from __future__ import annotations

import collections
import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch

from knng.engine import stages
from knng.engine.checkpoint import Checkpoint
from knng.engine.common import (
    TF32_EXACT_SAMPLES, Progress, recover_from_oom, tf32_products,
)
from knng.engine.exact import ExactStats
from knng.engine.graph.frames import GlobalFrames, PrincipalFrames, Tile, Window, span_window
from knng.engine.graph.report import GraphReport
from knng.engine.plan import (
    EnginePlan, held_pairs_limit, held_take_in_step, holds_survivors, strip_seed_count,
)
from knng.engine.screen import (
    ScoreBuffer, Survivors, block_scores, pair_scores, row_survivors, screen_pairs, screen_pairs_later, screen_rows,
    screen_own_later, strip_minima, survivors_of_smallest,
)
from knng.engine.store import (
    CandidateStore, Holding, PairNorms, summarize_per_row_each,
)
from knng.engine.thresholds import seed_candidates, smallest_candidates, strip_candidates
from knng.metrics import Metric, ScreenPrecision
from knng._options import get_options
from knng.engine.kernels import screen_kernel_runs, strip_seeds_run

__all__ = ["screen_own_part", "screen_own_parts_together", "own_parts_together", "off_diagonal_blocks",
           "SharedThresholds", "BlockCounts", "holding_for", "finish_rows", "graph_report", "retry_on_oom",
           "STORE_ARRAYS"]

#: Shared block thresholds (one per point, against the corpus's largest norm) only while the
#: largest norm of every part is within this factor of the smallest part maximum.
UNIFORM_NORMS = 1.5
#: The candidate-store tensors a checkpoint saves (see CandidateStore.state).
STORE_ARRAYS = tuple(name.lstrip("_") for name in CandidateStore.STATE_TENSORS)
#: Store entries × 64 bytes the finish takes at a time: on a CPU rows that stay in cache; on a
#: GPU 32× more (at most an eighth of the budget), since each chunk is ~150 launches and ~10
#: synchronisations whatever its size (70 chunks of a 582k-point graph at k = 100 with 64 MiB;
#: the 16,384 × 4,096 graph at k = 1,024 in three chunks of 512 MiB took 62.0–65.4 ms, in one
#: 60.5–60.8, H200, one process alternating, 2026-11-27).
FINISH_BYTES = 64 << 20
FINISH_BYTES_GPU = 2 << 30
# ``Options.hold_on``: device types on which a graph whose blocks share one centre holds its
# survivors back (:class:`~knng.engine.store.Holding`) where a low-precision screen's keys need
# an exact evaluation anyway: every ``pending`` new survivors, each row's τ becomes its k-th
# held key (a selection, ``knng.engine.kernels.row_kth``) and what can no longer pass is dropped; the
# finish evaluates the rest. The store's updates sort and pad every row they touch, a few
# hundred launches and dozens of synchronisations each (1M × 128, k = 10, H100: 23 flushes,
# host 371 / GPU 132 ms under the profiler). On a CPU the store's capacity keeps its updates
# small.
#
# ``Options.hold_pairs``: whether graphs whose blocks are centred on their own parts hold their
# survivors too (each with its radius from its block's norms, ``Holding.pairs``); else their
# stores take the survivors in as they go (:data:`~knng.engine.plan.PENDING_GPU_UPDATES` at a
# time). Measured once exact products had removed the image patches' near-ties (H100, fresh
# processes alternating, min of 3, taken in / held, ms): 8×8 patches k = 10 249, 299 / 240,
# 241; k = 100 733, 769 / 599, 623; 16×16 k = 10 144, 162 / 120, 128; k = 100 314, 312 / 269,
# 275 (before that, held pairs lost at k = 100: ``docs/FINDINGS.md``, "Stores and survivors").
#: Own parts' screens queued ahead of the one whose survivors the store takes
#: (:func:`screen_own_parts_together`): enough to keep the GPU busy while the host hands a part
#: over, few enough that their survivor lists stay a small part of the peak.
OWN_PARTS_IN_FLIGHT = 3
#: The stride of a scattered seed sample is the part's size over this (the golden ratio: any
#: run of consecutive sample columns lands all over the part).
SCATTER_RATIO = (1 + 5**0.5) / 2


def holding_for(precision: ScreenPrecision, norms: torch.Tensor | None, terms: torch.Tensor | None,
                device: torch.device, *, n: int, capacity: int, pending: int, budget: int,
                escalate: int = 0) -> Holding | None:
    """How the graph's store holds its survivors back (``Options.hold_on``), or None: blocks screened
    in a low precision. With one centre (``norms``: every point's prepared norm in it) the held
    pairs tighten against the corpus's largest norm and term; with blocks centred on their own
    parts (``norms`` None: principal slabs of image-like data) every survivor brings its
    block's norms and the held pairs tighten with their own radii. Beyond the store's own size
    (or four flushes' worth: :func:`~knng.engine.plan.held_pairs_limit`) they are
    taken in, whose capacity bounds near-ties, as many at a time as the ``budget`` allows
    (:func:`~knng.engine.plan.held_take_in_step`). ``n``, ``capacity``, ``pending``: the store's
    rows, candidates a row keeps, and survivors it takes in at a time; ``escalate``: held
    survivors above which a row is escalated (the plan's ``escalate_pairs``; 0: never)."""
    if not holds_survivors(device, precision):
        return None
    limit = get_options().held_limit
    if limit is None:
        limit = held_pairs_limit(n, capacity, pending)
    step = held_take_in_step(limit, pending, budget)
    if norms is None:
        return Holding(limit=limit, pairs=True, step=step, escalate=escalate) if get_options().hold_pairs else None
    maxima = (float(norms.max()), 0.0 if terms is None else float(terms.abs().max()))
    return Holding(maxima=maxima, limit=limit, step=step, escalate=escalate)


def finish_rows(plan: EnginePlan, device: torch.device) -> int:
    """Rows the exact finish takes at a time (see :data:`FINISH_BYTES`; its temporaries take about
    64 bytes per store entry, and at most an eighth of the budget)."""
    finish_bytes = min(FINISH_BYTES if device.type == "cpu" else FINISH_BYTES_GPU, plan.budget // 8)
    return max(1, min(plan.n_corpus, finish_bytes // max(1, plan.capacity * 64)))


def graph_report(plan: EnginePlan, store: CandidateStore, counts: "BlockCounts", checkpoint: Checkpoint | None,
                  done: int, precision: ScreenPrecision) -> GraphReport:
    """The report of a finished graph run (store counters are of the whole run, every band's)."""
    exact = ExactStats(rows=plan.n_corpus, exact_evaluations=store.stats.exact_evaluations)
    evaluated, screened = summarize_per_row_each([[counts.evaluations_per_row(store)],
                                                  [counts.screened_per_row(store)]])
    return GraphReport(plan=plan, oom_retries=counts.retries, exact=exact, store=store.stats,
                       evaluations_per_row=evaluated, screened_per_row=screened,
                       blocks_skipped=plan.parts * (plan.parts - 1) // 2 - counts.computed,
                       pairs_screened=counts.screened, exact_products=precision.exact_products,
                       checkpoints={} if checkpoint is None else checkpoint.summary(done))


# Options.whole_by_smallest_on: a part's own block, materialised whole, takes each row's
# survivors from its smallest entries (smallest_width of them, by float32 key) instead of a
# compare of the whole block against the thresholds those entries seed: one selection does both.
# From Options.whole_by_smallest_min_k = GPU_CHUNK_SEED_MAX_K + 1 (below, a GPU's seeds are chunk
# minima, not a selection).


def smallest_width(columns: int, k: int) -> int:
    """Entries a row selects to hold its survivors: k and a margin for near-ties at the k-th
    (a row whose survivors reach past them is compared whole)."""
    return min(columns, k + max(16, k // 32))


def screen_own_part(tile: Tile, d: int, metric: Metric, store: CandidateStore, row_ids: torch.Tensor,
                    col_ids: torch.Tensor, k: int, include_self: bool, select: str, device: torch.device,
                    sub_rows: int | None = None, *, precision: ScreenPrecision, carry_norms: bool = False,
                    buffer: ScoreBuffer | None = None) -> None:
    """Block S(J, J) of one part: seed its rows' thresholds from their own part, then screen it.

    ``tile`` is the part prepared around one centre (input dimension ``d``); its row t is store
    row ``row_ids[t]`` and column id ``col_ids[t]``; ``carry_norms``: survivors bring the tile's
    norms to the store (a tile centred on its own part); ``buffer``: where the materialised block
    is written. Rows go ``sub_rows`` at a time; each step
    changes the store only after its product and screen, so it may be retried whole.

    The torch screen materialises the block once: the k best of each row seed its threshold
    and the same block is screened. The fused kernel never materialises it, so the seeds come
    from a sample of the part: the kernel's strip minima of a scattered sample that grows with
    k (:func:`_strip_seed_columns`) where it finds them, else a product of the reference form
    of at most ``Options.own_part_seed`` evenly spaced columns; the kernel screens the whole block
    against them (only its upper triangle where the wgmma kernel runs and the rows go at once:
    :func:`~knng.engine.screen.screen_own_later`).
    """
    prep, terms = tile.vectors, tile.terms32
    m = prep.shape[0]
    queries = tile.queries(metric, d)
    step = m if sub_rows is None else max(1, sub_rows)
    ks = min(k, m if include_self else m - 1)
    whole = not (screen_kernel_runs(device, precision) and m > get_options().own_part_seed)
    # Seeds from the kernel's strip minima of a sample where it finds them, 2k strips or more
    # (the sample grows with k, scattered over the part: _strip_seed_columns).
    by_strips = not whole and strip_seeds_run(device, precision, strip_seed_count(m, ks), ks)
    # The whole block's survivors from each row's smallest entries (Options.whole_by_smallest_on).
    by_smallest = (whole and device.type in get_options().whole_by_smallest_on
                   and ks >= max(1, get_options().whole_by_smallest_min_k))
    if whole:
        seed_cols, seed_prep, seed_terms = torch.arange(m, device=device), prep, terms
    else:
        seed_cols = _strip_seed_columns(m, ks, device) if by_strips else _evenly_spaced(m, get_options().own_part_seed, device)
        seed_prep, seed_terms = prep[seed_cols], None if terms is None else terms[seed_cols]
    # A sampled seed's product may run on TF32 tensor cores where they hold the stored values
    # exactly (its keys only bound τ; the screen that follows is the kernel's).
    tf32 = not whole and precision.name in TF32_EXACT_SAMPLES and device.type == "cuda"
    maxima = tile.maxima()
    errors = store.errors
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        local = torch.arange(r0, r1, device=device)
        rows = row_ids[r0:r1]
        row_terms = None if terms is None else terms[r0:r1]
        minima = None
        if by_strips:
            # The kernel's strip minima of the sample: no block is written (for a 32,768-row part
            # and 8,192 columns, 1 GB of keys, its terms added and reduced: ~2 ms a part).
            minima = strip_minima(queries[r0:r1], seed_prep, d, precision, row_terms=row_terms, col_terms=seed_terms)
        else:
            with tf32_products() if tf32 else contextlib.nullcontext():
                scores = block_scores(queries[r0:r1], seed_prep, d, precision, row_terms, seed_terms,
                                      buffer if whole else None, symmetric=whole and r1 - r0 == m)
            if not include_self:
                # By index, not by distance: duplicates stay.
                if whole:
                    scores[local - r0, local] = torch.inf
                else:
                    _without_own_columns(scores, seed_cols, local, r0)
        if ks >= 1:
            if minima is not None:
                keys, strip_cols = minima
                if not include_self:  # a row's own column, where a strip found it, seeds nothing
                    keys = torch.where(seed_cols[strip_cols] == local[:, None], torch.inf, keys)
                values, positions = strip_candidates(keys, strip_cols, ks)
            elif by_smallest:
                values, positions = smallest_candidates(scores, smallest_width(scores.shape[1], ks), select, device)
            else:
                values, positions = seed_candidates(scores, min(ks, scores.shape[1]), select, device)
            cols = seed_cols[positions]
            rad = errors.radius(*_pair_norms(tile, tile, local[:, None].expand_as(cols), cols), values,
                                rows[:, None].expand_as(cols))
            store.seed(rows, col_ids[cols], values, rad, distinct=by_smallest)
        thresholds = store.screen_thresholds(rows, *maxima, row_norms=tile.norms[r0:r1],
                                             row_terms=_part(tile.terms, r0, r1))
        if by_smallest:
            kept, found = survivors_of_smallest(scores, values, positions, thresholds)
            if not include_self:  # by index, as below (an infinite τ keeps even the row's own column)
                kept &= positions != local[:, None]
            if not store.take_whole_rows(rows, col_ids[positions], values.to(torch.float64), rad, kept):
                r, c = torch.nonzero(kept, as_tuple=True)
                store.add(rows[r], col_ids[positions[r, c]], values[r, c],
                          _pair_norms(tile, tile, local[r], positions[r, c]) if carry_norms else None)
            owner, other, keys = found.owner + r0, found.other, found.keys
            if not include_self:
                keep = owner != other
                owner, other, keys = owner[keep], other[keep], keys[keep]
        elif whole:
            found = row_survivors(scores, thresholds)
            owner, other, keys = found.owner + r0, found.other, found.keys
            if not include_self:
                keep = owner != other
                owner, other, keys = owner[keep], other[keep], keys[keep]
        else:
            scores = None
            if r1 - r0 == m:  # the whole part at once: its upper triangle where the kernel screens one
                found = screen_own_later(queries, prep, d, thresholds, precision, terms=terms,
                                         exclude_diagonal=not include_self)()
            else:
                found = screen_rows(queries[r0:r1], prep, d, thresholds, precision, row_terms=row_terms,
                                    col_terms=terms, exclude_diagonal=None if include_self else -r0)
            owner, other, keys = found.owner + r0, found.other, found.keys
        store.add(row_ids[owner], col_ids[other], keys, _pair_norms(tile, tile, owner, other) if carry_norms else None)


def own_parts_together(frames: "GlobalFrames | PrincipalFrames", store: CandidateStore, precision: ScreenPrecision,
                        device: torch.device, k: int, include_self: bool) -> bool:
    """Whether every part's own block runs at once (:func:`screen_own_parts_together`): a store
    that holds its survivors back (of one centre, or pairs with their blocks' norms), blocks
    screened by a kernel, each part seeded by the kernel's strip minima of its own sample (2k
    strips or more in the largest part)."""
    if not store.holds_back or not screen_kernel_runs(device, precision):
        return False
    m = max(i1 - i0 for i0, i1 in frames.parts)
    ks = min(k, m if include_self else m - 1)
    return strip_seeds_run(device, precision, strip_seed_count(m, ks), ks)


def screen_own_parts_together(frames: "GlobalFrames | PrincipalFrames", d: int, metric: Metric, store: CandidateStore,
                              k: int, include_self: bool, precision: ScreenPrecision, select: str = "auto",
                              parts: "list[int] | None" = None, handed: "set[int] | None" = None) -> None:
    """Every part's own block S(J, J) in a few launches, instead of :func:`screen_own_part` part by
    part (about 115 launches and two dozen synchronisations each on a GPU: 804 launches and
    34 ms of host time for the seven parts of a 200k-point graph, for 16 ms of GPU work).

    Each part's seeds come from a scattered sample of the part, as in :func:`screen_own_part`
    (the kernel's strip minima, :func:`strip_minima`, or, in a part too small for 2k strips, a
    materialised sample selected by ``select``; a point's own column
    seeds nothing; in principal slabs a part's own points are its rows' nearest, and seeds from
    a sample of the whole data let 18 % more pairs through a 200k × 128 graph at k = 10). Then
    each part's own block is screened against them (one kernel launch each; its upper triangle
    where the wgmma kernel runs, :func:`~knng.engine.screen.screen_own_later`) and the survivors
    of every part go to the store together. Exact for the same reasons as the
    part-by-part pass; the store changes only by seeds (which only lower τ, with valid bounds)
    and the final hand-over, so the whole step may be retried after an out-of-memory error.
    Positions are the frames' (principal slabs sort the points), the store's rows and columns
    the points' ids. Parts prepared around centres of their own (principal frames of image-like
    data) seed with their tiles' radii and hand their survivors in with their tiles' norms.
    ``parts``: only these parts' own blocks (a share of a graph; default every part).
    ``handed``: the parts whose survivors the store already has, filled as they go in. The
    caller keeps it across a retry after an out-of-memory error: the seeds are made again (they
    only lower τ), but a part's survivors are never handed over twice — a pair held twice would
    count twice among its row's k upper bounds and could tighten τ below the k-th distance.
    """
    stages.count("graph.own_parts_together")
    n = frames.n
    device = frames.device
    shared = not (isinstance(frames, PrincipalFrames) and frames.local)
    ids = frames.ids(0, 0, n)
    chosen = range(len(frames.parts)) if parts is None else parts
    spans = [frames.parts[p] for p in chosen]
    if not spans:
        return
    if shared:
        whole = frames.column(0, 0, 0, n)
        tiles = [whole.slice(i0, i1) for i0, i1 in spans]  # each part around the one centre
    else:
        tiles = [frames.own(p) for p in chosen]
    for tile, (i0, i1) in zip(tiles, spans):
        m = i1 - i0
        ks = min(k, m if include_self else m - 1)
        if ks < 1:
            continue
        local = torch.arange(m, device=device)
        queries, terms = tile.queries(metric, d), tile.terms32
        if strip_seeds_run(device, precision, strip_seed_count(m, ks), ks):
            at = _strip_seed_columns(m, ks, device)
            keys, strip_cols = strip_minima(queries, tile.vectors[at], d, precision, row_terms=terms,
                                            col_terms=None if terms is None else terms[at])
            if not include_self:  # by index, not by distance: a duplicate of the point still seeds
                keys = torch.where(at[strip_cols] == local[:, None], torch.inf, keys)
            values, positions = strip_candidates(keys, strip_cols, ks)
        else:
            # A part too small for 2k strips (often the last one: 5,025 rows of the folded 16×16
            # patches, which screened ~5,000 pairs a row unseeded at k = 100): seeds from a
            # materialised sample of its columns, as screen_own_part takes them.
            at = _evenly_spaced(m, get_options().own_part_seed, device)
            scores = block_scores(queries, tile.vectors[at], d, precision, terms,
                                  None if terms is None else terms[at])
            if not include_self:
                _without_own_columns(scores, at, local, 0)
            values, positions = seed_candidates(scores, min(ks, at.numel()), select, device)
        cols, rows = at[positions], ids[i0:i1]
        rad = None if shared else store.errors.radius(
            *_pair_norms(tile, tile, local[:, None].expand_as(cols), cols), values, rows[:, None].expand_as(cols))
        store.seed(rows, ids[i0 + cols], values, rad)
    # Every row's threshold in one computation (each part's own maxima, per row), every part's
    # launch queued before any list is sized: the store changes only when all are in.
    # (Each part's maxima repeated over its rows by views: sizes copied to the device from the
    # host would wait for every seed's launch to finish first.)
    max_norms, max_terms = (torch.cat([value.reshape(1).expand(i1 - i0) for value, (i0, i1) in zip(m, spans)])
                            for m in zip(*(tile.maxima() for tile in tiles)))
    row_norms = torch.cat([tile.norms for tile in tiles])
    row_terms = None if tiles[0].terms is None else torch.cat([tile.terms for tile in tiles])
    rows = ids if parts is None else torch.cat([ids[i0:i1] for i0, i1 in spans])
    thresholds = store.screen_thresholds(rows, max_norms, max_terms, row_norms=row_norms, row_terms=row_terms)
    starts = [0]
    for i0, i1 in spans:
        starts.append(starts[-1] + i1 - i0)
    # Each part's survivors go to the store as they are read: all parts' at once were 158M pairs
    # of an 8×8 patch graph at k = 100 (nine parts of 65,536), their copies 29 GB at the peak
    # whatever the budget; the store holds, tightens and takes in within its own limit. At most
    # OWN_PARTS_IN_FLIGHT launches are queued ahead of the part being read: each holds survivor
    # lists of at least 2²⁴ entries a side (384 MB), and all nine queued at once were 3.4 GB of
    # that graph's 12.6 GB peak. The thresholds were computed above, so a part launched after
    # an earlier part's survivors went in keeps what it would have kept launched with them.
    handed = set() if handed is None else handed
    todo = [at for at, part in enumerate(chosen) if part not in handed]

    def launch(at: int) -> Callable[[], Survivors]:
        tile, a, b = tiles[at], starts[at], starts[at + 1]
        return screen_own_later(tile.queries(metric, d), tile.vectors, d, thresholds[a:b], precision,
                                terms=tile.terms32, exclude_diagonal=not include_self)

    in_flight = collections.deque(launch(at) for at in todo[:OWN_PARTS_IN_FLIGHT])
    for step, at in enumerate(todo):
        tile, (i0, i1) = tiles[at], spans[at]
        found = in_flight.popleft()()  # (the launch's lists are released with it)
        if step + OWN_PARTS_IN_FLIGHT < len(todo):
            in_flight.append(launch(todo[step + OWN_PARTS_IN_FLIGHT]))
        before = store.pairs_handed_in
        try:
            store.add(ids[i0:i1][found.owner], ids[i0:i1][found.other], found.keys,
                      None if shared else _pair_norms(tile, tile, found.owner, found.other))
        finally:
            if store.pairs_handed_in != before or found.owner.numel() == 0:
                handed.add(chosen[at])
        del found


def _without_own_columns(scores: torch.Tensor, sample: torch.Tensor, rows: torch.Tensor, first: int) -> None:
    """In place: +inf at each row's own column of a seed block, where the block's (sorted,
    distinct) ``sample`` columns of the part have it (``rows``: the rows' positions in the part,
    the block's first row at ``first``). By index, not by distance: duplicates stay. A scatter,
    not a mask over the whole block (two passes of 1 GB for 32,768 rows)."""
    at = (rows - first, torch.searchsorted(sample, rows).clamp_max(sample.numel() - 1))
    scores[at] = torch.where(sample[at[1]] == rows, torch.inf, scores[at])


def _strip_seed_columns(m: int, k: int, device: torch.device) -> torch.Tensor:
    """The positions of :func:`~knng.engine.plan.strip_seed_count` columns of a part of ``m``, scattered so that
    each strip of consecutive sample columns takes points from all over the part: i·s mod m
    for i < count, s coprime with m near m/φ (distinct: a permutation of the part where count
    is m). Principal slabs sort their points, and neighbours that share a contiguous strip
    give it one minimum between them: sorted strips over a whole 8×8 patch part let p99 4,537
    pairs a row through at k = 100, against 950 from 8,192 evenly spaced columns."""
    count = strip_seed_count(m, k)
    step = max(1, round(m / SCATTER_RATIO))
    while math.gcd(step, m) != 1:
        step += 1
    return torch.arange(count, device=device) * step % m


def _evenly_spaced(m: int, count: int, device: torch.device) -> torch.Tensor:
    """min(count, m) distinct positions in [0, m), evenly spaced, the first and the last included
    (⌊i·(m − 1)/(count − 1)⌋: steps of at least one where count ≤ m), ascending. Integer
    arithmetic, so no ``unique`` (a synchronisation a part) is needed to make them distinct."""
    if count >= m:
        return torch.arange(m, device=device)
    if count == 1:
        return torch.zeros(1, dtype=torch.int64, device=device)
    return torch.arange(count, device=device) * (m - 1) // (count - 1)


def _pair_norms(row_tile: Tile, col_tile: Tile, owner: torch.Tensor, other: torch.Tensor) -> PairNorms:
    """The prepared norms and terms of pairs (``owner`` of ``row_tile``, ``other`` of ``col_tile``)."""
    return PairNorms(row_tile.norms[owner], col_tile.norms[other],
                     None if row_tile.terms is None else row_tile.terms[owner],
                     None if col_tile.terms is None else col_tile.terms[other])


def _part(values: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return None if values is None else values[start:stop]


class SharedThresholds:
    """Block thresholds of every point at once, for runs whose blocks share one centre.

    With one centre a point's prepared norm is the same in every block, so its threshold
    against the corpus's largest norm and term holds for every block (a little wider than
    against one block's own maxima) and changes only when τ does: one computation per store
    update instead of two per block (0.8 s of 7.5 s of a 64,009-point CPU graph). Thresholds
    from before an update are larger, hence still valid.
    """

    def __init__(self, store: CandidateStore, norms: torch.Tensor, terms: torch.Tensor | None) -> None:
        self.store = store
        self.max_norm = float(norms.max())
        self.max_term = 0.0 if terms is None else float(terms.abs().max())
        self.version = -1
        self.values = norms

    @classmethod
    def when_uniform(cls, store: CandidateStore, norms: torch.Tensor, terms: torch.Tensor | None,
                     parts: list[torch.Tensor]) -> "SharedThresholds | None":
        """Shared thresholds when every part's largest norm is within :data:`UNIFORM_NORMS` of the
        corpus's; else None (a few outliers would widen every block's thresholds, not only
        their own blocks')."""
        part_max = torch.stack([norms[ids].max() for ids in parts])
        if float(part_max.max()) > UNIFORM_NORMS * float(part_max.min()):
            return None
        stages.count("graph.shared_thresholds")
        return cls(store, norms, terms)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.version != self.store.updates:
            every = torch.arange(self.store.n, device=ids.device)
            self.values = self.store.screen_thresholds(every, self.max_norm, self.max_term)
            self.version = self.store.updates
        return self.values[ids]


class _OffDiagonalBlock:
    """The ``window`` of block S(I, J), I < J: each entry tested for its row (part I) and its column
    (part J), in three steps that the graph's loop interleaves with the next block's. The
    window's columns may run on past part J into the parts after it (:func:`span_window`: the
    ``members`` blocks S(I, J'), J' ≥ J, in one launch).

    :meth:`start` issues the block's product (it needs nothing from the store) or, where a
    kernel screens it, the kernel's launch against the store's present thresholds (its lists
    sized in :meth:`screen`); :meth:`screen` computes both sides' thresholds and keeps the
    survivors; :meth:`add` hands them to the store. On a GPU the loop issues the next block's
    product or launch before this block's store update unless that update changes τ (then the
    next window must see the new thresholds), so the update's launches queue behind the next
    block's work instead of leaving the GPU idle before it; the store sees the same survivors
    in the same order as one block after the other.

    ``thresholds``: every point's threshold, when all blocks share one centre and the parts'
    norms are alike (else each block's are computed against its own maxima); ``carry_norms``:
    survivors bring their block's norms (blocks centred on their own part); ``buffer``: where the
    materialised block is written.
    """

    def __init__(self, frames: "GlobalFrames | PrincipalFrames", metric: Metric, pi: int, pj: int, window: Window,
                 precision: ScreenPrecision, *, carry_norms: bool, buffer: ScoreBuffer | None = None,
                 slots: "Callable[[int], torch.Tensor] | None" = None, members: int = 1) -> None:
        self.window, self.precision, self.carry_norms, self.buffer = window, precision, carry_norms, buffer
        self.members = members
        self.d = d = frames.d
        own = frames.own(pi)
        own.queries(metric, d)  # kept on the part's tile, so that its slices share it
        self.rows_tile = own.slice(window.r0, window.r1)
        self.cols_tile = frames.column(pj, pi, window.c0, window.c1)
        self.rows = frames.ids(pi, window.r0, window.r1)
        self.cols = frames.ids(pj, window.c0, window.c1)
        # Store rows of the block's points: their ids, unless the store holds bands of rows (then
        # the block is one part's: a part's slots end with it).
        assert slots is None or window.c1 <= frames.parts[pj][1] - frames.parts[pj][0]
        self.row_slots = self.rows if slots is None else slots(pi)[window.r0:window.r1]
        self.col_slots = self.cols if slots is None else slots(pj)[window.c0:window.c1]
        self.queries = self.rows_tile.queries(metric, d)
        self.scores: torch.Tensor | None = None
        self.launched: Callable[[], tuple[Survivors, Survivors]] | None = None

    def start(self, store: CandidateStore, thresholds: "SharedThresholds | None") -> None:
        """Issue the product (where the block is materialised), or the kernel's screen against
        the store's present thresholds (where a kernel screens it; sized by :meth:`screen`)."""
        if screen_kernel_runs(self.queries.device, self.precision):
            self.launched = screen_pairs_later(self.queries, self.cols_tile.vectors, self.d,
                                               *self._thresholds(store, thresholds), self.precision,
                                               row_terms=self.rows_tile.terms32, col_terms=self.cols_tile.terms32)
            return
        self.scores = pair_scores(self.queries, self.cols_tile.vectors, self.d, self.precision,
                                  row_terms=self.rows_tile.terms32, col_terms=self.cols_tile.terms32,
                                  buffer=self.buffer)

    def screen(self, store: CandidateStore, thresholds: "SharedThresholds | None") -> tuple[Survivors, Survivors]:
        """Both sides' survivors: those of the launch :meth:`start` issued, else against the
        store's current thresholds (the product again if it was dropped, or the launch again,
        after an out-of-memory error)."""
        launched, self.launched = self.launched, None
        if launched is not None:
            return launched()
        scores, self.scores = self.scores, None
        return screen_pairs(self.queries, self.cols_tile.vectors, self.d, lambda: self._thresholds(store, thresholds),
                            None, self.precision, row_terms=self.rows_tile.terms32,
                            col_terms=self.cols_tile.terms32, buffer=self.buffer, scores=scores)

    def _thresholds(self, store: CandidateStore, thresholds: "SharedThresholds | None"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both sides' thresholds from the store's present τ."""
        rows, cols, rows_tile, cols_tile = self.row_slots, self.col_slots, self.rows_tile, self.cols_tile
        if thresholds is not None:
            return thresholds(rows), thresholds(cols)
        # Both sides in one computation: the same float64 arithmetic per point, in half the
        # launches (it is a few dozen elementwise steps on vectors of at most a part).
        r = rows.numel()
        (row_max, row_term), (col_max, col_term) = rows_tile.maxima(), cols_tile.maxima()
        both = store.screen_thresholds(
            torch.cat([rows, cols]), torch.cat([col_max.expand(r), row_max.expand(cols.numel())]),
            torch.cat([col_term.expand(r), row_term.expand(cols.numel())]),
            row_norms=torch.cat([rows_tile.norms, cols_tile.norms]),
            row_terms=None if rows_tile.terms is None else torch.cat([rows_tile.terms, cols_tile.terms]))
        return both[:r], both[r:]

    def add(self, store: CandidateStore, by_row: Survivors, by_col: Survivors) -> None:
        """Hand the survivors to the store."""
        rows, cols = self.rows, self.cols
        norms = None
        if self.carry_norms:
            by_rows = _pair_norms(self.rows_tile, self.cols_tile, by_row.owner, by_row.other)
            by_cols = _pair_norms(self.cols_tile, self.rows_tile, by_col.owner, by_col.other)
            norms = PairNorms(*(None if a is None else torch.cat([a, b]) for a, b in zip(by_rows, by_cols)))
        store.add(torch.cat([self.row_slots[by_row.owner], self.col_slots[by_col.owner]]),
                  torch.cat([cols[by_row.other], rows[by_col.other]]), torch.cat([by_row.keys, by_col.keys]), norms)


@dataclass
class BlockCounts:
    """A graph run's counters, carried by its checkpoints: out-of-memory retries, off-diagonal
    blocks computed and score entries screened. A banded run also gathers every row's report
    counters here as its bands finish (its device store holds two bands' rows only)."""

    retries: int = 0
    computed: int = 0
    screened: int = 0
    evaluations: torch.Tensor | None = None
    screened_rows: torch.Tensor | None = None

    def note_rows(self, store: CandidateStore, slots: slice, rows: slice, n: int) -> None:
        """Copy the per-row counters of store ``slots`` (global ``rows``)."""
        if self.evaluations is None or self.screened_rows is None:
            self.evaluations = torch.zeros(n, dtype=torch.int64)
            self.screened_rows = torch.zeros(n, dtype=torch.int64)
        self.evaluations[rows] = store.evaluations_per_row()[slots].cpu()
        self.screened_rows[rows] = store.screened_per_row()[slots].cpu()

    def evaluations_per_row(self, store: CandidateStore) -> torch.Tensor:
        return store.evaluations_per_row() if self.evaluations is None else self.evaluations

    def screened_per_row(self, store: CandidateStore) -> torch.Tensor:
        return store.screened_per_row() if self.screened_rows is None else self.screened_rows


def off_diagonal_blocks(frames: "GlobalFrames | PrincipalFrames", store: CandidateStore, metric: Metric,
                         precision: ScreenPrecision, thresholds: "SharedThresholds | None", device: torch.device, *,
                         carry_norms: bool, buffer: ScoreBuffer | None, bar: Progress, counts: BlockCounts,
                         first_step: int, done: int = 0, checkpoint_after: Callable[[int], None] | None = None,
                         checkpoint_due: Callable[[], bool] | None = None,
                         order: Iterable[tuple[int, int]] | None = None,
                         slots: Callable[[int], torch.Tensor] | None = None, group: int = 1,
                         dealer: "BlockDealer | None" = None) -> int:
    """Every block S(I, J), I < J, whose window is not empty, counted in ``counts``; returns the
    step reached. See :class:`_OffDiagonalBlock` for the order of steps.

    ``group``: column parts one launch screens (``frames.block_groups``; the plan's
    ``group_parts``). Steps number the blocks of ``frames.block_groups(group)`` from
    ``first_step``, one per block S(I, J); those below ``done`` were finished before a
    checkpoint and are passed over (a checkpoint is taken after whole groups, and a resumed run
    has the same plan, hence the same groups). ``checkpoint_after(s)`` runs once every step
    below ``s`` is in the store; a checkpoint that is due is taken like a flushing update,
    before the next block's window (the window then sees the new thresholds). ``order``: the
    blocks to run, one per launch (default ``frames.block_groups(group)``); ``slots(part)``: the
    store rows of a part's points (default their ids).

    ``dealer``: a share of a graph's run (:attr:`~knng.engine.plan.EnginePlan.share_index`)
    screens only the groups the dealer deals it, every group dealt in the order above, whatever a
    checkpoint had done. Every group's window is still found: principal frames stop at the first
    band of distances where none is live, and this run's thresholds prove that for its own
    groups and the others' alike.
    """
    step = first_step
    groups = frames.block_groups(group) if order is None else ((i, range(j, j + 1)) for i, j in order)

    def windows() -> Iterator[tuple[int, _OffDiagonalBlock]]:
        nonlocal step
        for pi, col_parts in groups:
            here, step = step, step + len(col_parts)
            bar.update(len(col_parts))
            mine = dealer is None or dealer.takes(len(col_parts))
            if here < done:
                for pj in col_parts:
                    frames.note_done(pi, pj)
                continue
            found = span_window(frames, pi, col_parts, store.tau, store.updates)
            if found is not None and mine:
                window, members = found
                yield step - 1, _OffDiagonalBlock(frames, metric, pi, col_parts[0], window, precision,
                                                  carry_norms=carry_norms, buffer=buffer, slots=slots, members=members)

    def start(item: tuple[int, _OffDiagonalBlock] | None) -> tuple[int, _OffDiagonalBlock] | None:
        if item is not None:
            counts.retries += retry_on_oom(lambda: item[1].start(store, thresholds), device)
        return item

    def screen(block: _OffDiagonalBlock) -> tuple[Survivors, Survivors]:
        found: list[tuple[Survivors, Survivors]] = []
        # A retry drops the product (block.screen takes it) and computes it again.
        counts.retries += retry_on_oom(lambda: found.append(block.screen(store, thresholds)), device)
        return found[-1]

    todo = windows()
    item = start(next(todo, None))
    while item is not None:
        last, block = item  # the last step of the block's group
        by_row, by_col = screen(block)
        saving = checkpoint_due is not None and checkpoint_due()
        # (Asking may take held survivors in, which may run out of memory: retried as a block's
        # steps are, what was not taken in waiting for the next update.)
        flushing: list[bool] = []
        counts.retries += retry_on_oom(
            lambda: flushing.append(store.would_flush(by_row.owner.numel() + by_col.owner.numel())), device)
        if saving or flushing[-1]:
            counts.retries += retry_on_oom(lambda: block.add(store, by_row, by_col), device)
            counts.computed += block.members
            counts.screened += 2 * block.window.pairs
            if saving and checkpoint_after is not None:
                checkpoint_after(last + 1)
            following = start(next(todo, None))
        else:
            following = start(next(todo, None))
            counts.retries += retry_on_oom(lambda: block.add(store, by_row, by_col), device)
            counts.computed += block.members
            counts.screened += 2 * block.window.pairs
        item = following
    return step


class BlockDealer:
    """Deals a graph's groups of off-diagonal blocks to ``count`` shares, each group to the share
    with the least work so far (the lowest index among equals): every share's run deals the same
    sequence of groups alike, so each group goes to exactly one share, and the shares' work
    differs by less than a group.

    Work is counted in blocks; an own part S(I, I) a share screens alone counts as one block
    (the same P × P product), so the shares that took one more own part take fewer groups.
    """

    def __init__(self, index: int, count: int, own_parts: list[int] | None = None) -> None:
        self.index = index
        self.loads = list(own_parts) if own_parts is not None else [0] * count

    def takes(self, blocks: int) -> bool:
        """Deal the next group of ``blocks`` blocks; whether it is this share's."""
        share = min(range(len(self.loads)), key=lambda s: (self.loads[s], s))
        self.loads[share] += blocks
        return share == self.index

    @classmethod
    def of(cls, plan: EnginePlan, own_parts_split: bool = False) -> "BlockDealer | None":
        """The dealer of a plan's share (None for a whole graph). ``own_parts_split``: the
        shares screen the own parts p of share p mod count only (else every share screens
        every own part, and they weigh alike)."""
        if plan.share_count == 1:
            return None
        own = [len(range(s, plan.parts, plan.share_count)) for s in range(plan.share_count)] if own_parts_split \
            else None
        return cls(plan.share_index, plan.share_count, own)


def retry_on_oom(step: Callable[[], None], device: torch.device, attempts: int = 3) -> int:
    """Run ``step``; after a device out-of-memory error free the allocator's cache and run it again.

    Returns the number of retries. ``step`` must be safe to repeat after a failure: the graph's
    block steps compute their product and screen before they change the store.
    """
    for attempt in range(attempts):
        try:
            step()
            return attempt
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
            recover_from_oom(exc, device, can_retry=attempt < attempts - 1)
    return attempts
