"""The Triton kernel that unfolds duplicate groups into rows (:mod:`knng.engine.kernels.unfold`).

Imported only where Triton is installed, by this topic's launchers; module-level functions, because a
``triton.jit`` function finds the jitted helpers it calls among its module's globals. Triton reads
``TRITON_INTERPRET`` when this module is imported.
"""

import triton
import triton.language as tl


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _unfold_list(jj, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku, HAS_OWN: tl.constexpr):
    """Candidate list ``jj`` of a row (``duplicates._CandidateLists``): with HAS_OWN list 0 is the
    row's own group ``own_g`` at its ``own_dist`` and list j ≥ 1 column j − 1 of row ``source``
    of ``idx``/``dist``; else list j is column j. Its group (−1: none) and distance (+inf)."""
    col = jj
    if HAS_OWN:
        col = jj - 1
    ok = (col >= 0) & (col < ku)
    grp = tl.load(idx + source * stride_idx + col, mask=ok, other=-1)
    dd = tl.load(dist + source * stride_dist + col, mask=ok, other=float("inf"))
    if HAS_OWN:
        grp = tl.where(jj == 0, own_g, grp)
        dd = tl.where(jj == 0, tl.load(own_dist + own_g), dd)
    return grp, dd


@triton.jit
def unfold_rows_kernel(own_group, idx, dist, own_dist, sizes, starts, members, reps, position, out_idx, out_dist,
                       unordered, k, ku, stride_idx, stride_dist, HAS_OWN: tl.constexpr, DROP_SELF: tl.constexpr,
                       BL: tl.constexpr, BK: tl.constexpr):
    """Row ``program_id``'s first k candidates with its lists laid end to end, as
    ``duplicates._unfold_by_slots``: each list's length cut to the members that can rank below k
    (k − the members of the lists at smaller distances), its start the lengths before it, slot s
    member s − start of the list whose span holds it, the row itself skipped in its own list
    (DROP_SELF, its place from ``position``). BL ≥ the lists, BK ≥ k. ``unordered[row]`` = 1
    where consecutive lists at one distance interleave by index (the caller sorts that row
    instead); −1 and +inf past the row's candidates."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BL)
    own_g = row * 0
    source = row
    if HAS_OWN:
        own_g = tl.load(own_group + row)
        source = own_g
    grp, dd = _unfold_list(j, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku, HAS_OWN)
    present = grp >= 0
    grp = tl.where(present, grp, 0)
    size = tl.load(sizes + grp, mask=present, other=0)
    place = tl.full([], -1, tl.int64)
    if DROP_SELF:
        size = tl.where(j == 0, size - 1, size)
        place = tl.load(position + row) - tl.load(starts + own_g)
    _, dd_before = _unfold_list(j - 1, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku, HAS_OWN)
    run = (j == 0) | (dd != dd_before)
    ahead = tl.associative_scan(tl.where(run, tl.cumsum(size, 0) - size, 0), 0, _larger)
    length = tl.minimum(size, tl.maximum(k - ahead, 0))
    ends = tl.cumsum(length, 0)
    start = ends - length
    # Slots: each list with members before slot k marks its first slot with its number (in the
    # row's own output, as scratch), and a running maximum over the slots gives each slot its
    # list and that list's first slot.
    s = tl.arange(0, BK)
    in_row = s < k
    tl.store(out_idx + row * k + s, -1, mask=in_row)
    tl.debug_barrier()
    tl.store(out_idx + row * k + start, j.to(tl.int64), mask=(length > 0) & (start < k))
    tl.debug_barrier()
    mark = tl.load(out_idx + row * k + s, mask=in_row, other=-1)
    tl.debug_barrier()
    which = tl.associative_scan(mark, 0, _larger)
    offset = s - tl.associative_scan(tl.where(mark >= 0, s, 0), 0, _larger)
    filled = in_row & (s < tl.sum(length, axis=0))
    slot_group, slot_dist = _unfold_list(which, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku,
                                         HAS_OWN)
    if DROP_SELF:
        offset += ((which == 0) & (offset >= place)).to(tl.int64)
    slot_group = tl.where(filled, slot_group, 0)
    member = tl.load(members + tl.load(starts + slot_group, mask=filled, other=0) + offset, mask=filled, other=-1)
    tl.store(out_idx + row * k + s, member, mask=in_row)
    tl.store(out_dist + row * k + s, tl.where(filled, slot_dist, float("inf")), mask=in_row)
    # Order: list j against list j + 1.
    grp_next, dd_next = _unfold_list(j + 1, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku,
                                     HAS_OWN)
    next_present = grp_next >= 0
    first_next = tl.load(reps + tl.where(next_present, grp_next, 0), mask=next_present, other=0)
    last_offset = length - 1
    if DROP_SELF:
        last_offset += ((j == 0) & (last_offset >= place)).to(tl.int64)
    has = length > 0
    last = tl.load(members + tl.load(starts + grp, mask=has, other=0) + last_offset, mask=has, other=-1)
    wrong = has & next_present & (start < k) & (dd == dd_next) & (last > first_next)
    tl.store(unordered + row, tl.max(wrong.to(tl.int32), axis=0))
