"""CPU reference of the quick multi-select kernels (``cuda/qms.cu``), step for step.

This module *defines* what the kernels compute, down to the order of their unsorted output,
so the GPU tests can compare them exactly and CI (no GPU) can test the logic:

* :func:`partition_step` — one step of the paper's warp partition: the ``ballot`` on "below the
  pivot" and on "above", each lane's slot from ``popc`` of the ballot masked to the lanes before
  it, the shared staging array (left side from the left end, right side from the right end)
  and the two coalesced writes. Widths above 32 add the block variant's inter-warp prefix sum.
* :func:`partition` — a whole pass, step by step: the "less" entries in their old order, a hole
  where the pivot was, the "greater" entries reversed (the right side grows down from the end).
* :func:`quick_multi_select` — the paper's loop over passes with a stack of (buffer, start, end,
  output offset) references instead of copying kept partitions back; pivots from the same hash.
* :func:`sample_pivot`, :func:`filter_plan`, :func:`filter_select` — knng's single-pass variant:
  a pivot from a sample estimating the k-th value, one filtering read, a sort of the few
  candidates; rows whose candidates do not fit fall back to :func:`quick_multi_select`.

Keys are the composite keys of :mod:`knng.select.keys` (distinct within a row), so a pivot taken
from the row splits it three ways and every pass removes at least the pivot.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from knng.select.keys import NAN_BITS, composite_keys, decode_bits, ordered_bits

__all__ = [
    "mix32", "pivot_position", "partition_step", "partition", "quick_multi_select", "sample_keys",
    "sample_pivot", "filter_plan", "filter_select", "Trace", "keys_to_output",
    "next_pow2", "STACK_SIZE", "SAMPLE_PER_THREAD", "FILTER_THREADS", "MIN_CAP", "MAX_CAP",
]

MASK32 = 0xFFFFFFFF
ROW_MIX, PASS_MIX, SAMPLE_MIX = 0x9E3779B1, 0x7FEB352D, 0x68E31DA4
#: Kept-segment references held before they are copied to the output (qms.cu's STACK_SIZE).
STACK_SIZE = 32
#: Sample keys per thread, and threads of the filter kernel: a 4096-entry sample.
SAMPLE_PER_THREAD, FILTER_THREADS = 8, 512
#: Candidate capacities of the filter kernel's shared memory (8 bytes per candidate), and the
#: most keys it holds with room for the k winners beside the candidates (192 of 227 KiB).
MIN_CAP, MAX_CAP, MAX_SHARED_KEYS = 2048, 16384, 24576
#: Standard deviations of room above the expected candidate count (see :func:`filter_plan`):
#: 4.5 keeps k = 2048 of 65 536 in 4096 slots (48 KiB with the winners, three blocks per SM);
#: the ~3e-6 of rows that overflow take the exact fallback.
Z_MARGIN = 4.5
_SENTINEL = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix32(x: int) -> int:
    """murmur3's 32-bit finaliser (``mix32`` in ``common.cuh``)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & MASK32
    x ^= x >> 16
    return x


def pivot_position(seed: int, row: int, pass_no: int, start: int, size: int) -> int:
    """Where pass ``pass_no`` of ``row`` takes its random pivot in a segment ``[start, start+size)``."""
    h = mix32((seed ^ ((row * ROW_MIX) & MASK32) ^ ((pass_no * PASS_MIX) & MASK32)) & MASK32)
    return start + h % size


@dataclass
class StepRecord:
    """What one partition step did (the quantities the paper's figures 2–4 show)."""

    left_ballots: list[int]   # per warp: bit i set when lane i's entry is below the pivot
    right_ballots: list[int]  # per warp: bit i set when lane i's entry is above the pivot
    staging: np.ndarray       # the shared array after the step (unused slots are sentinels)
    n_left: int
    n_right: int


def partition_step(chunk: np.ndarray, pivot: int) -> StepRecord:
    """One step of the partition over ``len(chunk)`` lanes (32 per warp; the last may be ragged).

    Lane ``i`` of warp ``w`` with an entry below the pivot writes it to staging slot
    ``left_offset[w] + popc(ballot_left & lanes_before_i)``; one above it to slot
    ``width - 1 - (right_offset[w] + popc(ballot_right & lanes_before_i))``; offsets are the
    exclusive prefix sums over warps (zero for a single warp). The pivot itself goes nowhere.
    """
    width = -(-len(chunk) // 32) * 32
    lanes = np.zeros(width, dtype=np.uint64)
    valid = np.zeros(width, dtype=bool)
    lanes[: len(chunk)], valid[: len(chunk)] = chunk, True
    is_left = valid & (lanes < np.uint64(pivot))
    is_right = valid & (lanes > np.uint64(pivot))
    staging = np.full(width, _SENTINEL, dtype=np.uint64)
    lb, rb = [], []
    left_off = right_off = 0
    for w in range(width // 32):
        sl = slice(32 * w, 32 * w + 32)
        bl = sum(1 << i for i in range(32) if is_left[sl][i])
        br = sum(1 << i for i in range(32) if is_right[sl][i])
        lb.append(bl)
        rb.append(br)
        for lane in range(32):
            before = (1 << lane) - 1
            if is_left[sl][lane]:
                staging[left_off + bin(bl & before).count("1")] = lanes[sl][lane]
            elif is_right[sl][lane]:
                staging[width - 1 - (right_off + bin(br & before).count("1"))] = lanes[sl][lane]
        left_off += bin(bl).count("1")
        right_off += bin(br).count("1")
    return StepRecord(lb, rb, staging, left_off, right_off)


def partition(segment: np.ndarray, pivot: int, width: int = 32) -> tuple[np.ndarray, int, int, int]:
    """A whole pass over ``segment`` in steps of ``width`` lanes, as the kernels write it.

    Returns ``(out, L, R, E)``: ``out[:L]`` the entries below the pivot in their old order,
    ``out[len-R:]`` those above it, reversed, and ``E`` (0 or 1) entries equal to the pivot;
    a slot left for the pivot at ``out[L]`` holds a sentinel.
    """
    if width % 32:
        raise ValueError(f"width must be a multiple of 32, got {width}")
    n = len(segment)
    out = np.full(n, _SENTINEL, dtype=np.uint64)
    gl, gr = 0, n
    for base in range(0, n, width):
        step = partition_step(segment[base: base + width], pivot)
        w = len(step.staging)
        out[gl: gl + step.n_left] = step.staging[: step.n_left]
        out[gr - step.n_right: gr] = step.staging[w - step.n_right:]
        gl += step.n_left
        gr -= step.n_right
    return out, gl, n - gr, n - gl - (n - gr)


@dataclass
class Trace:
    """The passes one row took: (buffer, start, end, pivot, L, R, E) each."""

    passes: list[tuple[int, int, int, int, int, int, int]] = field(default_factory=list)


def _split(seg: np.ndarray, pivot: int) -> tuple[np.ndarray, np.ndarray]:
    return seg[seg < np.uint64(pivot)], seg[seg > np.uint64(pivot)][::-1]


def quick_multi_select(row_values: np.ndarray, k: int, *, row: int = 0, seed: int = 0,
                       sampled_rank: int = -1, threads: int = FILTER_THREADS,
                       trace: Trace | None = None) -> np.ndarray:
    """The k smallest composite keys of one row, in the order ``qms_block``/``qms_warp`` emit them.

    Each pass partitions the active segment of one buffer into the other (buffer 0 is the row
    itself, 1 and 2 the auxiliary arrays). With L entries below the pivot and k' still wanted:
    k' ≤ L keeps only the left side; otherwise the left side is kept *by reference* (pushed on
    the stack with its output offset), the pivot is emitted, and the right side goes on with
    k' − L − 1. ``sampled_rank ≥ 0`` takes the first pivot from :func:`sample_pivot` instead of a
    random entry (a value no entry equals). Returns uint64 composite keys.
    """
    n = len(row_values)
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, {n}], got {k}")
    bufs = [composite_keys(np.asarray(row_values, np.float32)[None, :])[0],
            np.zeros(n, np.uint64), np.zeros(n, np.uint64)]
    out = np.full(k, _SENTINEL, dtype=np.uint64)
    stack: list[tuple[int, int, int, int]] = []

    def flush() -> None:
        for buf, start, end, pos in stack:
            out[pos: pos + end - start] = bufs[buf][start:end]
        stack.clear()

    buf, lo, hi, kk, pos, pass_no = 0, 0, n, k, 0, 0
    done = k == 0
    while not done:
        size = hi - lo
        if kk == size:
            stack.append((buf, lo, hi, pos))
            break
        if pass_no == 0 and sampled_rank >= 0:
            p = sample_pivot(row_values, row=row, seed=seed, rank=sampled_rank, threads=threads)
            pivot = (p << 32) | MASK32
        else:
            pivot = int(bufs[buf][pivot_position(seed, row, pass_no, lo, size)])
        dst = 2 if buf == 1 else 1
        left, right = _split(bufs[buf][lo:hi], pivot)
        L, R = len(left), len(right)
        E = size - L - R
        bufs[dst][lo: lo + L], bufs[dst][hi - R: hi] = left, right
        if trace is not None:
            trace.passes.append((buf, lo, hi, pivot, L, R, E))
        if kk <= L:
            if kk == L:
                stack.append((dst, lo, lo + L, pos))
                done = True
            else:
                buf, hi = dst, lo + L
        else:
            if L:
                stack.append((dst, lo, lo + L, pos))
            pos += L
            if E:
                out[pos] = pivot
                pos += 1
            kk -= L + E
            if kk == 0:
                done = True
            else:
                buf, lo = dst, hi - R
        if len(stack) == STACK_SIZE:
            flush()
        pass_no += 1
    flush()
    return out


def sample_keys(row_values: np.ndarray, *, row: int, seed: int, threads: int = FILTER_THREADS) -> np.ndarray:
    """The ordered bits the kernels sample from one row (all of it when it is short)."""
    bits = ordered_bits(np.asarray(row_values, np.float32))
    n, s = len(bits), threads * SAMPLE_PER_THREAD
    if n <= s:
        return bits
    chunks = s // 32
    stratum = n // chunks
    span = stratum - 31
    starts = [c * stratum + mix32(seed ^ SAMPLE_MIX ^ ((row * ROW_MIX) & MASK32) ^ ((c * PASS_MIX) & MASK32))
              % span for c in range(chunks)]
    return np.concatenate([bits[s0: s0 + 32] for s0 in starts])


def sample_pivot(row_values: np.ndarray, *, row: int, seed: int, rank: int,
                 threads: int = FILTER_THREADS) -> int:
    """The rank-th smallest (0-based) sampled key, or ``NAN_BITS`` ("every entry") past the end."""
    keys = np.sort(sample_keys(row_values, row=row, seed=seed, threads=threads))
    return int(keys[rank]) if rank < len(keys) else NAN_BITS


#: Chance per row that the sampled pivot leaves fewer than k candidates (the row then takes the
#: slow exact fallback): binomial, not normal, tails — at k·s/n = 4 a normal margin of 5σ
#: still failed 2e-5 of rows, and one fallback row costs a whole extra pass of one block.
MISS_PROBABILITY = 1e-7


@functools.lru_cache(maxsize=4096)
def _safe_rank(s: int, p: float) -> int:
    """The 0-based sample rank r with P(Binomial(s, p) ≥ r + 1) ≤ ``MISS_PROBABILITY``.

    The count of sampled entries at or below the row's k-th value is Binomial(s, k/n); the
    pivot (the r-th smallest sample) lies at or above the k-th value unless that count is > r.
    """
    from scipy.stats import binom

    return int(binom.isf(MISS_PROBABILITY, s, p))


def next_pow2(x: int) -> int:
    """The smallest power of two ≥ x (1 for x ≤ 1)."""
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.lru_cache(maxsize=4096)  # asked per block by resolve() and by qms itself
def filter_plan(n: int, k: int, threads: int = FILTER_THREADS) -> tuple[int, int] | None:
    """``(rank, cap)`` for the filter kernel on rows of n, or None where it cannot apply.

    ``rank`` is the sample rank of the pivot (−1: every entry is a candidate) and ``cap`` the
    shared-memory capacity in candidates. With a sample of s entries the k-th value sits near
    rank k·s/n; the rank is taken where the binomial tail leaves fewer than k candidates with
    probability ``MISS_PROBABILITY`` per row, and ``cap`` is sized ``Z_MARGIN`` deviations
    above the expected count (k(1+ε), ε ≈ 6/√(k·s/n) for large k). Rows that miss either way are
    flagged and finished by :func:`quick_multi_select`: the result is exact regardless.
    """
    if k <= 0 or n <= 0:
        return None
    plan = _plan(n, k, threads)
    if plan is None or plan[1] + next_pow2(k) > MAX_SHARED_KEYS:
        return None
    return plan


def _plan(n: int, k: int, threads: int) -> tuple[int, int] | None:
    if n <= MIN_CAP:
        return -1, next_pow2(n)
    s = threads * SAMPLE_PER_THREAD
    if n <= s:  # the sample is the row itself: the pivot is the exact k-th value
        cap = max(MIN_CAP, next_pow2(k + k // 4))
        return (k - 1, cap) if cap <= MAX_CAP else None
    rank = min(s - 1, _safe_rank(s, k / n))
    expected = (rank + 1) * n / s
    spread = n * math.sqrt(rank + 1) / s
    cap = max(MIN_CAP, next_pow2(math.ceil(expected + Z_MARGIN * spread)))
    if cap >= next_pow2(n):
        return (-1, next_pow2(n)) if next_pow2(n) <= MAX_CAP else None
    return (rank, cap) if cap <= MAX_CAP else None


def keys_to_output(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 columns) of composite keys, values decoded from their ordered bits."""
    keys = np.asarray(keys, dtype=np.uint64)
    return decode_bits((keys >> np.uint64(32)).astype(np.uint32)), (keys & np.uint64(MASK32)).astype(np.int64)


def filter_select(values: np.ndarray, k: int, *, seed: int = 0, threads: int = FILTER_THREADS
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """knng's ``qms``: each row's k smallest, ascending, plus which rows fell back.

    Returns ``(values, indices, fell_back)``. Candidates are the entries whose bits are ≤ the
    sampled pivot; with between k and ``cap`` of them the answer is their sorted head, else the
    row goes to :func:`quick_multi_select` (random pivots) and is sorted afterwards.
    """
    v = np.asarray(values, dtype=np.float32)
    rows, n = v.shape
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, {n}], got {k}")
    out_keys = np.empty((rows, k), dtype=np.uint64)
    fell_back = np.zeros(rows, dtype=bool)
    plan = filter_plan(n, k, threads)
    for r in range(rows):
        keys = composite_keys(v[r: r + 1])[0]
        if plan is not None and k > 0:
            rank, cap = plan
            p = NAN_BITS if rank < 0 else sample_pivot(v[r], row=r, seed=seed, rank=rank, threads=threads)
            # The kernel compares floats with decode(p): a prefix of the order holding key <= p.
            taken = np.ones(n, bool) if p == NAN_BITS else v[r] <= decode_bits(np.array([p], np.uint32))[0]
            cand = keys[taken]
            if k <= len(cand) <= cap:
                out_keys[r] = np.sort(cand)[:k]
                continue
        fell_back[r] = plan is not None and k > 0
        rank = -1 if plan is None else plan[0]
        out_keys[r] = np.sort(quick_multi_select(v[r], k, row=r, seed=seed, sampled_rank=rank, threads=threads))
    vals, idx = keys_to_output(out_keys)
    # The block's own values (the kernels decode them; only NaN payloads can differ).
    return np.take_along_axis(v, idx, axis=1), idx, fell_back
