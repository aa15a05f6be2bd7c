"""Who computes what: the block-cyclic plan of the distributed k-NN graph.

The data are split into P parts A_0 … A_{P−1}; the distance matrix into blocks S(I, J), of which
only those with I ≤ J are computed. As in Dashti et al. (2013), block *columns* are dealt to the
ranks cyclically: the rank that owns part J computes every block S(I, J), I ≤ J, keeps part J's
column candidates to itself, and finishes part J's rows at the end. Block row I needs A_I on
every rank that owns a column J ≥ I; it is read in pieces by all ranks and assembled by an
all-gather, and each rank's row candidates for part I are merged and sent to part I's owner.

Departure from the paper: the columns are dealt in a *reflected* cyclic order (0, 1, …, R−1,
R−1, …, 1, 0, 0, 1, …) instead of J mod R. Column J holds J + 1 blocks, so the plain order gives
rank R−1 the most work in every round (with P = 2R parts: 2R against R + 2 blocks, a 2:1
imbalance); the reflected order pairs a short column with a long one and gives every rank the
same number of blocks whenever P is a multiple of 2R. The planner therefore picks P as a
multiple of 2R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

__all__ = ["BlockPlan", "reflected_owner", "choose_parts", "shard_ranges"]


def reflected_owner(part: int, world: int) -> int:
    """Owner of block column ``part`` in the reflected cyclic order (0 … R−1, R−1 … 0, …)."""
    c = part % (2 * world)
    return c if c < world else 2 * world - 1 - c


def choose_parts(n: int, world: int, max_part: int, min_parts: int = 4, min_part: int = 2048) -> int:
    """Number of parts P for ``n`` points on ``world`` ranks.

    At least what the memory allows (parts of at most ``max_part`` points), at least
    ``min_parts`` for the symmetric saving unless parts would fall below ``min_part`` points,
    and a multiple of 2·world so that the reflected cyclic order balances exactly.
    """
    if n < 1 or world < 1 or max_part < 1:
        raise ValueError(f"need n ≥ 1, world ≥ 1 and max_part ≥ 1, got {n}, {world}, {max_part}")
    parts = max(math.ceil(n / max_part), min(min_parts, math.ceil(n / min_part)), 1)
    if world > 1:
        step = 2 * world
        parts = max(step, -(-parts // step) * step)
    return min(parts, n)


def shard_ranges(n: int, world: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal row ranges of ``n`` rows, one per rank (some may be empty)."""
    size = -(-n // world)
    return [(min(n, r * size), min(n, (r + 1) * size)) for r in range(world)]


@dataclass(frozen=True)
class BlockPlan:
    """The distributed graph's parts, their owners and each rank's blocks.

    Attributes
    ----------
    n : int
        Points.
    world : int
        Ranks.
    part_size : int
        Points per part (the last part may be smaller).
    """

    n: int
    world: int
    part_size: int

    @classmethod
    def build(cls, n: int, world: int, max_part: int) -> "BlockPlan":
        """The plan with :func:`choose_parts` parts."""
        parts = choose_parts(n, world, max_part)
        return cls(n=n, world=world, part_size=-(-n // parts))

    @cached_property
    def parts(self) -> tuple[tuple[int, int], ...]:
        """(start, stop) of every part."""
        b = self.part_size
        return tuple((s, min(self.n, s + b)) for s in range(0, self.n, b))

    @property
    def n_parts(self) -> int:
        return len(self.parts)

    def owner(self, part: int) -> int:
        """The rank that owns block column (and row list) ``part``."""
        return reflected_owner(part, self.world)

    def owned(self, rank: int) -> list[int]:
        """Parts owned by ``rank``, ascending."""
        return [j for j in range(self.n_parts) if self.owner(j) == rank]

    def row_blocks(self, rank: int, row: int) -> list[int]:
        """Columns J ≥ ``row`` of block row ``row`` that ``rank`` computes."""
        return [j for j in range(row, self.n_parts) if self.owner(j) == rank]

    def blocks(self, rank: int) -> list[tuple[int, int]]:
        """Every block (I, J), I ≤ J, that ``rank`` computes, block row by block row."""
        return [(i, j) for i in range(self.n_parts) for j in self.row_blocks(rank, i)]

    def piece(self, part: int, rank: int) -> tuple[int, int]:
        """Rows of ``part`` that ``rank`` reads for the part's all-gather (equal pieces)."""
        p0, p1 = self.parts[part]
        size = self.piece_rows(part)
        return min(p1, p0 + rank * size), min(p1, p0 + (rank + 1) * size)

    def piece_rows(self, part: int) -> int:
        """Rows per piece of ``part`` (the all-gather's fixed size; the last pieces are padded)."""
        p0, p1 = self.parts[part]
        return -(-(p1 - p0) // self.world)

    def work(self, rank: int) -> int:
        """Score entries ``rank`` computes (the balance the plan aims at)."""
        sizes = [s1 - s0 for s0, s1 in self.parts]
        return sum(sizes[i] * sizes[j] for i, j in self.blocks(rank))

    def total_blocks(self) -> int:
        return self.n_parts * (self.n_parts + 1) // 2
