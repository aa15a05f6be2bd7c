"""Pieces shared by the search and graph loops: device choice, precision guard, the corpus
pass, prepared-corpus access, the top-k merge, out-of-memory handling and progress."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from knng._inputs import InputArray, check_finite
from knng.metrics import Metric, Prepared
from knng.select import select_columns

__all__ = [
    "choose_screen_dtype", "resolve_device", "full_precision", "CorpusStats", "corpus_stats", "PreparedCorpus",
    "merge_topk", "select_block", "CandidateLists", "is_out_of_memory", "Progress",
]


def resolve_device(device: str | torch.device, *inputs: InputArray) -> torch.device:
    """The compute device for ``device=`` ("auto", "cpu", "cuda", "cuda:1" or a torch.device).

    "auto" computes where a GPU tensor input lives, else on the first GPU if there is one,
    else on the CPU.
    """
    if isinstance(device, str) and device == "auto":
        for arr in inputs:
            if arr.device.type == "cuda":
                return arr.device
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} asks for a GPU but torch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or a CUDA device, got {device!r}")
    return dev


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Force IEEE float32 matrix products (no TF32/bf16 shortcuts) while the engine runs.

    The rounding-error bound assumes float32 inputs; a user's global
    ``torch.set_float32_matmul_precision("high")`` (or ``fp32_precision = "tf32"`` in the newer
    API) would silently void it. Whichever API the user set is restored afterwards.
    """
    try:
        previous = torch.get_float32_matmul_precision()
    except RuntimeError:  # the user set the newer per-backend API; the legacy getter refuses
        previous = None
    if previous is not None:
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)
        return
    backends = [torch.backends.cuda.matmul, torch.backends.mkldnn.matmul]
    saved = [b.fp32_precision for b in backends]
    for b in backends:
        b.fp32_precision = "ieee"
    try:
        yield
    finally:
        for b, value in zip(backends, saved):
            b.fp32_precision = value


@dataclass(frozen=True)
class CorpusStats:
    """What one pass over the corpus learns: the common centre (or None)."""

    centre: torch.Tensor | None


def corpus_stats(corpus: InputArray, metric: Metric, device: torch.device, *, symmetric: bool,
                 block_rows: int) -> CorpusStats:
    """Check the corpus is finite and, where the metric centres, compute its float64 mean."""
    need_mean = metric.needs_centre(symmetric)
    total = torch.zeros(corpus.d, dtype=torch.float64, device=device)
    for start, block in corpus.iter_blocks(block_rows):
        block = block.to(device, non_blocking=True)
        check_finite(block, corpus.name, start)
        if need_mean:
            total += block.to(torch.float64).sum(dim=0)
    return CorpusStats(centre=total / corpus.n if need_mean else None)


#: Largest prepared-vector norm whose squares and products stay far from float32 overflow.
MAX_SCREEN_NORM = 1e18


class PreparedCorpus:
    """The corpus in the screen's layout, resident on the device or prepared tile by tile.

    Also holds, for every corpus vector, the float64 norm and term the exactness
    certificate needs (n floats each, always resident).
    """

    def __init__(self, corpus: InputArray, metric: Metric, centre: torch.Tensor | None,
                 device: torch.device, *, resident: bool, block_rows: int, symmetric: bool,
                 dtype: torch.dtype = torch.float32) -> None:
        self.corpus, self.metric, self.centre, self.device = corpus, metric, centre, device
        self.symmetric, self.dtype = symmetric, dtype
        self.centre_norm = 0.0 if centre is None else float(torch.linalg.vector_norm(centre))
        self.resident: torch.Tensor | None = None
        norms = torch.empty(corpus.n, dtype=torch.float64, device=device)
        terms = torch.empty(corpus.n, dtype=torch.float64, device=device) if metric.uses_terms else None
        blocks = []
        for start, raw in corpus.iter_blocks(block_rows):
            prep = self._prepare(raw)
            stop = start + raw.shape[0]
            norms[start:stop] = prep.norms
            if terms is not None:
                terms[start:stop] = prep.terms
            if resident:
                blocks.append(prep.vectors)
        if resident:
            self.resident = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        self._set_norms(norms, terms)

    @classmethod
    def from_norms(cls, corpus: InputArray, metric: Metric, centre: torch.Tensor | None, device: torch.device,
                   norms: torch.Tensor, terms: torch.Tensor | None, *, symmetric: bool,
                   dtype: torch.dtype = torch.float32) -> "PreparedCorpus":
        """A non-resident prepared corpus whose per-vector norms and terms are already known.

        No pass over ``corpus``: the distributed engine computes each rank's share of the norms
        and gathers them, so the exact finish can bound any candidate without reading its vector.
        Tiles are prepared from ``corpus`` on demand.
        """
        self = cls.__new__(cls)
        self.corpus, self.metric, self.centre, self.device = corpus, metric, centre, device
        self.symmetric, self.dtype = symmetric, dtype
        self.centre_norm = 0.0 if centre is None else float(torch.linalg.vector_norm(centre))
        self.resident = None
        self._set_norms(norms, terms)
        return self

    def _set_norms(self, norms: torch.Tensor, terms: torch.Tensor | None) -> None:
        self.norms, self.terms = norms, terms
        self._maxima: dict[tuple[int, int], tuple[float, float]] = {}
        self.max_norm = float(norms.max())
        if self.max_norm > MAX_SCREEN_NORM:
            raise ValueError(
                f"{self.corpus.name} has vectors of norm up to {self.max_norm:.3g} (after centring): too large "
                f"to screen in float32 (limit {MAX_SCREEN_NORM:.0e}); rescale the data")

    def _prepare(self, raw: torch.Tensor) -> Prepared:
        return self.metric.prepare(raw.to(self.device, non_blocking=True), self.centre,
                                   side="corpus", symmetric=self.symmetric, dtype=self.dtype)

    def maxima(self, start: int, stop: int) -> tuple[float, float]:
        """Largest norm and largest |term| of rows ``start:stop`` (a block's error radius).

        Remembered per range: a search asks for every corpus tile once per query chunk.
        """
        key = (start, stop)
        if key not in self._maxima:
            norm = float(self.norms[start:stop].max())
            term = float(self.terms[start:stop].abs().max()) if self.terms is not None else 0.0
            self._maxima[key] = (norm, term)
        return self._maxima[key]

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """Prepared rows at ``index`` (corpus layout) on the device."""
        if self.resident is not None:
            return self.resident[index.to(self.device)]
        return self._prepare(self.corpus.take(index)).vectors

    def tile(self, start: int, stop: int) -> torch.Tensor:
        """Prepared rows ``start:stop`` (corpus layout) on the device."""
        if self.resident is not None:
            return self.resident[start:stop]
        return self._prepare(self.corpus.rows(start, stop)).vectors


def choose_screen_dtype(device: torch.device, n_corpus: int, d: int, k: int) -> torch.dtype:
    """float32 or float64 for the screen, whichever makes the exact answer cheaper.

    After a float32 screen every kept candidate is re-ranked from the input vectors, which
    reads k·d values per row; a float64 screen pins most distances down by itself, at the price
    of 8-byte score blocks and slower products. On GPUs whose float64 matrix products run at
    the float32 rate (A100, H100/H200, B200: tensor-core DGEMM) the float64 screen wins once
    k·d outweighs the row length n; consumer GPUs run float64 at a small fraction of that rate,
    so they keep float32. On a CPU float64 products cost about twice float32 ones and the
    re-rank is relatively dearer: float64 already pays from k·d ≥ n/8 (measured on 2 cores:
    2048×512 k=100 graph 0.07 s against 0.74 s; 20000×128 k=10 equal).
    """
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) in FAST_FP64_CAPABILITIES and k * d >= 2 * n_corpus:
            return torch.float64
        return torch.float32
    return torch.float64 if 8 * k * d >= n_corpus else torch.float32


#: Compute capabilities whose float64 matrix products are about as fast as float32 ones.
FAST_FP64_CAPABILITIES = {(8, 0), (9, 0), (10, 0)}


def select_block(selector: Callable, scores: torch.Tensor, k: int, *, columns: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Each row's (or column's) k candidates of a score block, plus a floor for the rest.

    Returns ``(values, indices, floor)``: every entry not returned is ≥ ``floor`` (per row of
    the result), or ``floor`` is None when the selection is exact (then the largest returned
    value is that bound). A float64 block is selected on float32 keys when the algorithm would
    otherwise sort 8-byte values (radix selection makes twice the passes over twice the bytes);
    the keys order the block up to float32 rounding, which the floor accounts for, and the
    returned values are the block's own float64 entries.
    """
    exact_on_float64 = getattr(selector, "exact_on_float64", None)
    length = scores.shape[0] if columns else scores.shape[1]
    if scores.dtype != torch.float64 or (exact_on_float64 is not None and exact_on_float64(length, k)):
        values, indices = select_columns(selector, scores, k) if columns else selector(scores, k)
        return values, indices, None
    # Keys relative to one entry of each row keep float32 precision for the spread of the row,
    # not for its magnitude (cosine scores are all ≈ −1).
    block = scores.T if columns else scores
    ref = block[:, :2].amin(dim=1, keepdim=True)
    ref = torch.where(torch.isfinite(ref), ref, torch.zeros_like(ref))
    shifted = block - ref
    keys = shifted.to(torch.float32)
    key_values, indices = selector(keys, k)
    values = torch.gather(block, 1, indices)
    top = key_values.max(dim=1).values.to(torch.float64)
    # Round-to-nearest: an entry whose key is ≥ top was ≥ top − |top|·2⁻²³ after the shift,
    # and the float64 shift itself is off by at most 2⁻⁵² of the larger magnitude.
    floor = top - top.abs() * 2.0**-23 - 2.0**-140 + ref[:, 0]
    floor = floor - (floor.abs() + ref[:, 0].abs()) * 2.0**-51
    return values, indices, floor


def merge_topk(values: torch.Tensor | None, indices: torch.Tensor | None, new_values: torch.Tensor,
               new_indices: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the k smallest of two partial candidate lists per row (any order within a row)."""
    if values is None:
        return new_values, new_indices
    return _k_smallest_of([values, new_values], [indices, new_indices], k)


def _k_smallest_of(values: list[torch.Tensor], indices: list[torch.Tensor], k: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest per row of several candidate lists laid side by side."""
    cat_v = torch.cat(values, dim=1)
    cat_i = torch.cat(indices, dim=1)
    if cat_v.shape[1] <= k:
        return cat_v, cat_i
    v, pos = torch.topk(cat_v, k, dim=1, largest=False, sorted=False)
    return v, torch.gather(cat_i, 1, pos)


class CandidateLists:
    """Running candidate lists of every row, merged lazily.

    Blocks add partial lists for row ranges; a range's lists are merged into the running
    lists once they hold ``flush_factor`` times the list length, so a row that receives P
    partial lists pays about P / flush_factor selections instead of P.
    """

    def __init__(self, n: int, kc: int, dtype: torch.dtype, device: torch.device, flush_factor: int = 3) -> None:
        self.values = torch.full((n, kc), torch.inf, dtype=dtype, device=device)
        self.indices = torch.full((n, kc), -1, dtype=torch.int64, device=device)
        self.kc, self.flush_factor = kc, flush_factor
        self.pending: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def add(self, start: int, stop: int, values: torch.Tensor, indices: torch.Tensor) -> None:
        """Add partial lists (rows start:stop) of global candidate indices (no device work)."""
        self.pending.setdefault((start, stop), []).append((values, indices))

    def discard_last(self, start: int, stop: int) -> None:
        """Undo the latest :meth:`add` for rows start:stop (a block being retried whole)."""
        lists = self.pending[(start, stop)]
        lists.pop()
        if not lists:
            del self.pending[(start, stop)]

    def flush_due(self) -> None:
        """Merge the ranges whose pending lists have grown past the threshold.

        Each merge assigns only after it has succeeded, so an out-of-memory error leaves the
        lists as they were and the call can simply be repeated.
        """
        for (start, stop), lists in list(self.pending.items()):
            if sum(v.shape[1] for v, _ in lists) >= self.flush_factor * self.kc:
                self._flush(start, stop)

    def _flush(self, start: int, stop: int) -> None:
        lists = self.pending.get((start, stop), [])
        if not lists:
            return
        v, i = _k_smallest_of([self.values[start:stop], *[v for v, _ in lists]],
                              [self.indices[start:stop], *[i for _, i in lists]], self.kc)
        self.values[start:stop], self.indices[start:stop] = v, i
        del self.pending[(start, stop)]

    def finalize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Merge everything still pending; return the (n, kc) values and indices."""
        for start, stop in list(self.pending):
            self._flush(start, stop)
        return self.values, self.indices


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a device out-of-memory error that smaller tiles may avoid."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Progress:
    """A progress bar on standard error (tqdm) that costs nothing when disabled."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="blk", dynamic_ncols=True, leave=False)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
