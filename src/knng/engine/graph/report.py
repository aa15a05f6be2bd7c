"""The report of a graph run: a search's report plus the symmetric saving."""

from __future__ import annotations

from dataclasses import dataclass

from knng.engine.common import EngineReport

__all__ = ["GraphReport"]


@dataclass
class GraphReport(EngineReport):
    """How a graph run went: the report of a search plus the symmetric saving.

    ``blocks_skipped``: blocks S(I, J), I < J, that no row or column could need (principal
    frames); ``pairs_screened``: score entries the screen computed, both triangles counted;
    ``exact_products``: integer data screened with exact products (no input rounding in the
    bound: :func:`knng.metrics.with_exact_products`); ``rows_escalated``: rows whose held
    survivors outgrew the plan's ``escalate_pairs``, answered by a float64-screened search of
    their own (their screened counts are those they took before).
    """

    blocks_skipped: int = 0
    pairs_screened: int = 0
    exact_products: bool = False
    rows_escalated: int = 0

    @property
    def parts(self) -> int:
        return self.plan.parts

    @property
    def part_size(self) -> int:
        return self.plan.part_size

    @property
    def blocks_computed(self) -> int:
        return self.plan.blocks - self.blocks_skipped

    @property
    def blocks_full(self) -> int:
        return self.plan.parts ** 2

    @property
    def pairs_saving(self) -> float:
        """Share of the n² score entries (and matrix-product work) the run did not compute."""
        n = self.plan.n_corpus
        if self.pairs_screened and n:
            return 1.0 - self.pairs_screened / 2 / (n * n)
        return 1.0 - self.blocks_computed / self.blocks_full if self.blocks_full else 0.0
