"""The symmetric graph in bands of parts, for candidate stores that do not fit the device.

The stores live in a :class:`~knng.engine.store.ListHome` (pinned host memory, or memory-mapped
files); two bands of parts at a time are on the device, every block between them screened with
the steps of :mod:`.blocks`; each band's rows are finished when no later block can reach them.
"""

from __future__ import annotations


import torch

from knng.engine.checkpoint import Checkpoint
from knng.engine.common import (
    Progress,
)
from knng.engine.graph.frames import GlobalFrames
from knng.engine.plan import (
    EnginePlan,
)
from knng.engine.screen import (
    ScoreBuffer,
)
from knng.engine.store import (
    CandidateStore, ListHome, PairErrors, StoreStats,
)
from knng.metrics import Metric, ScreenPrecision
from knng.engine.graph.blocks import (
    BlockCounts, BlockDealer, SharedThresholds, finish_rows, off_diagonal_blocks, retry_on_oom, screen_own_part,
)

__all__ = ["graph_in_bands"]


def graph_in_bands(frames: GlobalFrames, plan: EnginePlan, metric: Metric, precision: ScreenPrecision,
                    centre: torch.Tensor | None,
                    include_self: bool, select: str, device: torch.device, progress: "bool | Progress",
                    checkpoint: Checkpoint | None, keep_checkpoint: bool, lists_folder: str | None
                    ) -> tuple[torch.Tensor, torch.Tensor, CandidateStore, "BlockCounts", int]:
    """The graph with every row's store in a :class:`ListHome` (where ``plan.lists`` says; a disk
    home in ``lists_folder``), run in bands of ``plan.band_parts`` parts.

    The device store has two bands of slots: the row band A at slot 0, the column band B after
    it. Units of work go in a fixed order: first each band with itself (its own parts seed its
    rows' thresholds, then its blocks S(I, J), I < J within it), then every pair of bands A < B
    (all blocks S(I, J), I in A, J in B), A outermost so that its stores stay on the device while
    the B bands pass by. Every block of the one-device order is computed once, so each row's
    answer, its exact top k, is the same bit for bit. Returns (indices, float64 distances, the
    device store, counters, units a resumed run had done); checkpoints are taken between units,
    once both bands' stores are back in the home (which then holds the whole state).
    """
    n, d, k = plan.n_corpus, plan.d, plan.k
    parts = frames.parts
    band_parts = plan.band_parts
    bands = [list(range(p0, min(len(parts), p0 + band_parts))) for p0 in range(0, len(parts), band_parts)]
    spans = [(parts[band[0]][0], parts[band[-1]][1]) for band in bands]
    width = max(r1 - r0 for r0, r1 in spans)
    norms, terms = frames.shared_norms()
    slot_ids = torch.zeros(2 * width, dtype=torch.int64, device=device)
    slot_norms = torch.zeros(2 * width, dtype=torch.float64, device=device)
    slot_terms = None if terms is None else torch.zeros_like(slot_norms)
    errors = PairErrors(metric=metric, d=d, precision=precision, row_norms=slot_norms, row_terms=slot_terms,
                        row_offsets=torch.zeros_like(slot_norms),
                        col_norms=norms, col_terms=terms,
                        centre_norm=0.0 if centre is None else float(torch.linalg.vector_norm(centre)))

    def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        return frames.evaluate(metric, slot_ids[rows], cols, device, plan.work_bytes)

    store = CandidateStore(2 * width, k, plan.capacity, errors, evaluate, device, pending=plan.pending_pairs,
                           work_bytes=plan.work_bytes)
    # A fresh store's row gives the home its arrays: names, shapes, types and initial values.
    with ListHome(n, store.rows_state(slice(0, 1)), plan.lists, folder=lists_folder,
                  pin=device.type == "cuda") as home:
        thresholds = SharedThresholds.when_uniform(store, norms, terms, [frames.ids(p) for p in range(len(parts))])
        buffer = ScoreBuffer() if device.type == "cpu" else None
        placed: dict[int, int] = {}  # band → its first slot

        def place(band: int, at: int) -> None:
            r0, r1 = spans[band]
            slot_ids[at:at + r1 - r0] = torch.arange(r0, r1, device=device)
            slot_norms[at:at + r1 - r0] = norms[r0:r1]
            if slot_terms is not None and terms is not None:
                slot_terms[at:at + r1 - r0] = terms[r0:r1]
            home.load(store, slice(at, at + r1 - r0), slice(r0, r1))
            placed[band] = at

        def put_back(band: int, *, keep: bool = False) -> None:
            r0, r1 = spans[band]
            at = placed[band] if keep else placed.pop(band)
            home.save(store, slice(at, at + r1 - r0), slice(r0, r1))

        def slots(part: int) -> torch.Tensor:
            band = part // band_parts
            i0, i1 = parts[part]
            at = placed[band] - spans[band][0]
            return torch.arange(i0 + at, i1 + at, device=device)

        units = [(a, a) for a in range(len(bands))] + [(a, c) for a in range(len(bands))
                                                       for c in range(a + 1, len(bands))]
        counts, done = BlockCounts(), 0
        if checkpoint is not None and checkpoint.resumed:
            saved = checkpoint.state
            assert saved is not None
            with checkpoint.restoring():
                done = checkpoint.check_step(len(units))
                home.restore(checkpoint.arrays())
                store.stats = StoreStats(**{f: int(v) for f, v in saved["store"].items()})
                counts = BlockCounts(*(int(saved[f]) for f in ("retries", "computed", "screened")))
        bar = Progress.of(progress, total=plan.blocks, desc="knng graph")
        row_band = -1
        dealer = BlockDealer.of(plan)  # one deal over every unit's blocks, those done included
        for unit, (a, c) in enumerate(units):
            if unit < done:
                if dealer is not None:  # the unit's blocks, one a launch, dealt as when they ran
                    for _ in range(len(bands[a]) * (len(bands[a]) - 1) // 2 if a == c else len(bands[a]) * len(bands[c])):
                        dealer.takes(1)
                bar.update(len(bands[a]) * (len(bands[a]) + 1) // 2 if a == c else len(bands[a]) * len(bands[c]))
                continue
            if row_band != a:
                if row_band >= 0:
                    put_back(row_band)
                place(a, 0)
                row_band = a
            if a == c:
                for pi in bands[a]:
                    ids = frames.ids(pi)
                    counts.retries += retry_on_oom(
                        lambda: screen_own_part(frames.own(pi), d, metric, store, slots(pi), ids, k, include_self,
                                                select, device, precision=precision, buffer=buffer), device)
                    counts.screened += ids.numel() ** 2
                    bar.update()
                order = [(i, j) for i in bands[a] for j in bands[a] if j > i]
            else:
                place(c, width)
                order = [(i, j) for i in bands[a] for j in bands[c]]
            off_diagonal_blocks(frames, store, metric, precision, thresholds, device, carry_norms=False,
                                 buffer=buffer, bar=bar, counts=counts, first_step=0, order=order, slots=slots,
                                 dealer=dealer)
            store.flush()
            if a != c:
                put_back(c)
            last = unit == len(units) - 1
            if checkpoint is not None and (checkpoint.due() or (last and keep_checkpoint)):
                put_back(a, keep=True)  # the home now holds every row's state
                checkpoint.save({"step": unit + 1, "progress": f"{unit + 1:,} of {len(units):,} band pairs done",
                                 "retries": counts.retries, "computed": counts.computed, "screened": counts.screened,
                                 "store": vars(store.stats)}, home.state())
        bar.close()
        if row_band >= 0:
            put_back(row_band)
        out_idx, out_dist = home.results(k)
        chunk = min(finish_rows(plan, device), width)
        for band in range(len(bands)):
            place(band, 0)
            r0, r1 = spans[band]
            for q0 in range(r0, r1, chunk):
                q1 = min(r1, q0 + chunk)
                idx, dist = store.finish(torch.arange(q0 - r0, q1 - r0, device=device))
                out_idx[q0:q1], out_dist[q0:q1] = idx.cpu(), dist.cpu()
            counts.note_rows(store, slice(0, r1 - r0), slice(r0, r1), n)
            placed.pop(band)
        return out_idx, out_dist, store, counts, done
