"""The Triton kernels of order statistics per row (:mod:`knng.engine.kernels.row_kth`) and of a
row's order by (distance, index) (:mod:`knng.engine.kernels.row_order`).

Imported only where Triton is installed, by this topic's launchers; module-level functions, because a
``triton.jit`` function finds the jitted helpers it calls among its module's globals. Triton reads
``TRITON_INTERPRET`` when this module is imported.
"""

import triton
import triton.language as tl


@triton.jit
def _signed_code(keys):
    """float32 keys as int32 codes whose signed order is the keys' (``row_kth.ordered_code`` − 2³¹)."""
    bits = keys.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see knng.engine.kernels
def row_count_kernel(rows, p, counts, BLOCK: tl.constexpr):
    """counts[r] += the pairs of row r among ``rows[:p]`` (int32 counters)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0)
    tl.atomic_add(counts + r, tl.full((BLOCK,), 1, tl.int32), mask=ok)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see knng.engine.kernels
def row_slots_kernel(rows, p, cursor, slots, BLOCK: tl.constexpr):
    """Each pair's slot within its row: ``cursor`` counts what each row has received (int32
    counters), so a row's slots are 0 … its count − 1 in whatever order the atomics gave."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0)
    slot = tl.atomic_add(cursor + r, tl.full((BLOCK,), 1, tl.int32), mask=ok)
    tl.store(slots + i, slot.to(tl.int64), mask=ok)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see knng.engine.kernels
def group_rows_kernel(rows, keys, p, starts, cursor, out, BLOCK: tl.constexpr):
    """Each pair's key code into its row's segment of ``out`` (row r's segment starts at
    ``starts[r]``; ``cursor`` counts what each row has received, so the order within a row is
    whatever the atomics gave)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0)
    key = tl.load(keys + i, mask=ok, other=0.0)
    slot = tl.atomic_add(cursor + r, tl.full((BLOCK,), 1, tl.int32), mask=ok)
    start = tl.load(starts + r, mask=ok, other=0)
    tl.store(out + start + slot, _signed_code(key), mask=ok)


@triton.jit
def row_kth_kernel(codes, starts, counts, n, k, firsts, kths, none, SKIP: tl.constexpr, CHUNK: tl.constexpr):
    """The smallest and the k-th smallest order code of each row's segment of ``codes`` (int32
    signed codes) with more than ``SKIP`` codes (``row_kth_small_kernel`` takes the others), by a
    radix select over the code's four bytes, most significant first: a 256-bin histogram of the
    byte among the codes that share the bytes chosen so far, and the bin where the running count
    reaches the rank left. Rows with fewer than k codes get ``none``. Programs stride over the
    rows: most rows of a graph's held survivors are short, and skipping them costs a load each
    instead of a program each."""
    for row in range(tl.program_id(0), n, tl.num_programs(0)):
        count = tl.load(counts + row)
        if count > SKIP:
            start = tl.load(starts + row)
            todo = tl.where(count >= k, count, 0)
            bins = tl.arange(0, 256)
            prefix = tl.full([], 0, tl.int64)
            rank = tl.full([], 0, tl.int64) + k
            first = tl.full([], 4294967296, tl.int64)
            for step in tl.static_range(4):
                shift = 24 - 8 * step
                hist = tl.zeros((256,), dtype=tl.int32)
                for c0 in range(0, todo, CHUNK):
                    j = c0 + tl.arange(0, CHUNK)
                    ok = j < todo
                    u = tl.load(codes + start + j, mask=ok, other=0).to(tl.int64) + 2147483648
                    if step == 0:
                        first = tl.minimum(first, tl.min(tl.where(ok, u, 4294967296), axis=0))
                    match = ok & ((u >> (shift + 8)) == (prefix >> (shift + 8)))
                    digit = tl.where(match, (u >> shift) & 255, 0).to(tl.int32)
                    # Codes that do not match were counted in bin 0: take them out again.
                    missed = CHUNK - tl.sum(match.to(tl.int32), axis=0)
                    hist += tl.histogram(digit, 256) - tl.where(bins == 0, missed, 0)
                below = tl.cumsum(hist, 0)
                chosen = tl.sum((below < rank).to(tl.int32), axis=0)
                rank -= tl.sum(tl.where(bins < chosen, hist, 0), axis=0).to(tl.int64)
                prefix += chosen.to(tl.int64) << shift
            full = count >= k
            tl.store(firsts + row, tl.where(full, first, none))
            tl.store(kths + row, tl.where(full, prefix, none))


@triton.jit
def row_kth_bisect_kernel(codes, starts, counts, n, k, firsts, kths, none, SKIP: tl.constexpr,
                          WIDTH: tl.constexpr):
    """``row_kth_kernel`` for the rows of more than ``SKIP`` and at most ``WIDTH`` codes, one row a
    program: its segment whole in registers, the k-th by bisection over the codes (the smallest
    code c with at least k codes ≤ c: 32 halvings of [smallest − 1, largest], as
    ``kth_of_rows_kernel``). One pass over the segment instead of the radix select's four.
    Rows with fewer than k codes get ``none``; other rows are left to the other kernels."""
    row = tl.program_id(0)
    count = tl.load(counts + row)
    if (count > SKIP) & (count <= WIDTH):
        start = tl.load(starts + row)
        j = tl.arange(0, WIDTH)
        ok = j < count
        code = tl.load(codes + start + j, mask=ok, other=0).to(tl.int64)
        lo = tl.min(tl.where(ok, code, 2147483647), axis=0)
        first = lo
        lo = lo - 1  # fewer than k codes ≤ lo (none); at least k ≤ hi (all, where count ≥ k)
        hi = tl.max(tl.where(ok, code, -2147483648), axis=0)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            enough = tl.sum((ok & (code <= mid)).to(tl.int32), axis=0) >= k
            hi = tl.where(enough, mid, hi)
            lo = tl.where(enough, lo, mid)
        full = count >= k
        tl.store(firsts + row, tl.where(full, first + 2147483648, none))
        tl.store(kths + row, tl.where(full, hi + 2147483648, none))


@triton.jit
def row_kth_small_kernel(codes, starts, counts, n, k, firsts, kths, none, ROWS: tl.constexpr,
                         WIDTH: tl.constexpr):
    """``row_kth_kernel`` for the rows of at most ``WIDTH`` codes, ``ROWS`` rows a program: each
    row's segment padded to WIDTH and sorted in registers; the smallest and the k-th are read
    off. Rows with more codes are left to ``row_kth_kernel``."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    count = tl.load(counts + r, mask=r < n, other=WIDTH + 1)
    small = (r < n) & (count <= WIDTH)
    start = tl.load(starts + r, mask=small, other=0)
    j = tl.arange(0, WIDTH)
    ok = small[:, None] & (j[None, :] < count[:, None])
    u = tl.load(codes + start[:, None] + j[None, :], mask=ok, other=0).to(tl.int64) + 2147483648
    u = tl.sort(tl.where(ok, u, 4294967296), dim=1)
    first = tl.min(u, axis=1)
    kth = tl.sum(tl.where(j[None, :] == k - 1, u, 0), axis=1)  # none where k > WIDTH: no row is full
    full = count >= k
    tl.store(firsts + r, tl.where(full, first, none), mask=small)
    tl.store(kths + r, tl.where(full, kth, none), mask=small)


@triton.jit
def row_kth_rounds_kernel(codes, starts, counts, n, firsts, kths, none, K: tl.constexpr, ROWS: tl.constexpr,
                          SKIP: tl.constexpr, WIDTH: tl.constexpr):
    """``row_kth_small_kernel`` for a small rank K (a constant) and the rows of more than SKIP
    (which that kernel takes) and at most WIDTH codes: each row's segment in registers,
    ``ROWS`` rows a program, and K − 1 rounds that take one occurrence of the smallest out (its
    first position gets the int32 maximum, at least every code); the smallest left is then the
    k-th. No sort: at K = 10 a graph's rows of ~80 held pairs went through the radix select,
    1.8 ms of a 200k-point graph's first tightening. Rows with more codes are left to
    ``row_kth_kernel``."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    count = tl.load(counts + r, mask=r < n, other=WIDTH + 1)
    small = (r < n) & (count > SKIP) & (count <= WIDTH)
    start = tl.load(starts + r, mask=small, other=0)
    j = tl.arange(0, WIDTH)
    ok = small[:, None] & (j[None, :] < count[:, None])
    top = 2147483647
    x = tl.where(ok, tl.load(codes + start[:, None] + j[None, :], mask=ok, other=0), top)
    first = tl.min(x, axis=1)
    for _ in tl.static_range(K - 1):
        at = tl.argmin(x, axis=1, tie_break_left=True)
        x = tl.where(j[None, :] == at[:, None], top, x)
    kth = tl.min(x, axis=1)
    full = count >= K
    tl.store(firsts + r, tl.where(full, first.to(tl.int64) + 2147483648, none), mask=small)
    tl.store(kths + r, tl.where(full, kth.to(tl.int64) + 2147483648, none), mask=small)


@triton.jit(do_not_specialize=["width", "k"])  # sizes of the data: see knng.engine.kernels
def row_order_kernel(idx, dist, width, k, order, W: tl.constexpr, J: tl.constexpr):
    """Row ``program_id``'s first k positions by (distance, index, position) among its ``width``
    entries (row-major (rows, width) ``idx``/``dist``; index −1 marks an empty entry, ordered
    after every other as if its distance were +inf and its index the largest; NaN distances
    after +inf): each entry's rank is the number of entries before it, so ``order[row, rank] =
    position`` for the ranks below k. The key is a strict total order, so the ranks are a
    permutation and every slot below min(k, width) is written."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, W)
    ok_i = i < width
    xi = tl.load(idx + row * width + i, mask=ok_i, other=-1)
    di = tl.load(dist + row * width + i, mask=ok_i, other=0.0)
    ni = (di != di) & (xi >= 0)  # NaN
    di = tl.where((xi >= 0) & (di == di), di, float("inf"))
    xi = tl.where(xi >= 0, xi, 9223372036854775807)
    rank = tl.zeros((W,), dtype=tl.int32)
    for j0 in range(0, width, J):
        j = j0 + tl.arange(0, J)
        ok_j = j < width
        xj = tl.load(idx + row * width + j, mask=ok_j, other=-1)
        dj = tl.load(dist + row * width + j, mask=ok_j, other=0.0)
        nj = (dj != dj) & (xj >= 0)
        dj = tl.where((xj >= 0) & (dj == dj), dj, float("inf"))
        xj = tl.where(xj >= 0, xj, 9223372036854775807)
        same_d = (nj[None, :] == ni[:, None]) & (dj[None, :] == di[:, None])
        tie = (xj[None, :] < xi[:, None]) | ((xj[None, :] == xi[:, None]) & (j[None, :] < i[:, None]))
        before = (nj[None, :] < ni[:, None]) | ((nj[None, :] == ni[:, None]) & (dj[None, :] < di[:, None]))
        before = (before | (same_d & tie)) & ok_j[None, :]
        rank += tl.sum(before.to(tl.int32), axis=1)
    tl.store(order + row * k + rank, i.to(tl.int64), mask=ok_i & (rank < k))


@triton.jit(do_not_specialize=["width", "head"])  # sizes of the data: see knng.engine.kernels
def row_head_kernel(idx, dist, width, head, codes, order, W: tl.constexpr):
    """Row ``program_id``'s first ``head`` positions in a stable sort of its float32 keys, and
    their keys' :func:`_signed_code` (row-major (rows, width) ``idx``/``dist``; index −1 marks
    an empty entry, keyed +inf): ``torch.sort(key32, stable=True)``'s first ``head`` of
    ``row_order._sorted_order``. Each key is rounded to float32 (to nearest), −0 taken as +0 so
    that equal codes are equal keys, and packed above its position into one int64 whose order
    is (key, position): one sort in registers, no ties left for it to break."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, W)
    ok = i < width
    x = tl.load(idx + row * width + i, mask=ok, other=-1)
    d = tl.load(dist + row * width + i, mask=ok, other=0.0)
    key = tl.where(x >= 0, d, float("inf")).to(tl.float32)
    key = tl.where(key == 0.0, 0.0, key)
    packed = (_signed_code(key).to(tl.int64) << 32) | i.to(tl.int64)
    packed = tl.sort(tl.where(ok, packed, 9223372036854775807))
    keep = i < head
    tl.store(order + row * head + i, packed & 0xFFFFFFFF, mask=keep)
    tl.store(codes + row * head + i, (packed >> 32).to(tl.int32), mask=keep)


@triton.jit
def smallest_of_rows_kernel(keys, cols, out_values, out_cols, m, width, stride, K: tl.constexpr,
                            ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Each row's K smallest of its ``width`` float32 keys (ROWS rows a program, a row whole in
    registers: WIDTH ≥ width, a power of two), ascending by (key, position), and the ``cols``
    entries at their positions: K rounds of an argmin over the keys' signed codes
    (:func:`_signed_code`: −0 just below +0), whose ties go to the smaller position; a taken
    position's code becomes the int32 maximum, at least every key's, so that no position is
    taken twice. NaN keys are not expected (the strip minima report none)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    at = tl.arange(0, WIDTH)
    row_ok = rows < m
    ok = row_ok[:, None] & (at < width)[None, :]
    base = rows.to(tl.int64) * stride
    taken = 2147483647
    code = tl.where(ok, _signed_code(tl.load(keys + base[:, None] + at[None, :], mask=ok, other=0.0)), taken)
    for j in tl.static_range(K):
        pos = tl.argmin(code, axis=1, tie_break_left=True)
        tl.store(out_values + rows * K + j, tl.load(keys + base + pos, mask=row_ok), mask=row_ok)
        tl.store(out_cols + rows * K + j, tl.load(cols + base + pos, mask=row_ok), mask=row_ok)
        code = tl.where(at[None, :] == pos[:, None], taken, code)


@triton.jit(do_not_specialize=["m", "width", "stride", "k"])  # sizes of the data: see knng.engine.kernels
def kth_of_rows_kernel(keys, m, width, stride, k, firsts, kths, counts, no_code, ROWS: tl.constexpr,
                       WIDTH: tl.constexpr):
    """Each row's smallest and k-th smallest of its ``width`` float32 keys (no NaN) as
    ``row_kth.ordered_code`` values, and ``width`` as its count (ROWS rows a program, a row
    whole in registers: WIDTH ≥ width, a power of two). The k-th by bisection over the keys'
    signed codes (:func:`_signed_code`): the smallest code c with at least k codes ≤ c, 32
    halvings of [smallest − 1, largest]. Rows of fewer than k keys get ``no_code`` for both."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    at = tl.arange(0, WIDTH)
    row_ok = rows < m
    ok = row_ok[:, None] & (at < width)[None, :]
    base = rows.to(tl.int64) * stride
    # int32 codes, the padding at the largest (above every key's: +inf's is 0x7F800000), so that
    # each halving compares and counts 32-bit words only; the range's ends and middle are int64
    # per row (their difference may pass 2³¹) and the middle fits int32 (first − 1 ≥ −inf's code − 1).
    code = tl.where(ok, _signed_code(tl.load(keys + base[:, None] + at[None, :], mask=ok, other=0.0)), 2147483647)
    lo = tl.min(code, axis=1).to(tl.int64)
    first = lo
    lo = lo - 1  # fewer than k codes ≤ lo (none); at least k ≤ hi (all of them, where width ≥ k)
    hi = tl.max(tl.where(ok, code, -2147483648), axis=1).to(tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        enough = tl.sum((code <= mid.to(tl.int32)[:, None]).to(tl.int32), axis=1) >= k
        hi = tl.where(enough, mid, hi)
        lo = tl.where(enough, lo, mid)
    full = width >= k
    tl.store(firsts + rows, tl.where(full, first + 2147483648, no_code), mask=row_ok)
    tl.store(kths + rows, tl.where(full, hi + 2147483648, no_code), mask=row_ok)
    tl.store(counts + rows, tl.zeros((ROWS,), tl.int64) + width, mask=row_ok)
