"""The exact k-NN graph of one device's data.

``symmetric`` :func:`exact_graph`: the plan, the frames, and the symmetric block loop with the
             stores on the device (or the rows method, or bands, where the plan says)
``bands``    the symmetric graph in bands of parts, its stores in host memory or on disk
``blocks``   the steps of a block loop: a part's own block (its seeds), the off-diagonal
             blocks S(I, J), I < J, once for both sides, the store's holding and shared
             thresholds; every block loop runs them, the distributed graph's per rank
``rows``     the graph by rows: the data searched against themselves for k + 1 neighbours
``frames``   the blocks' centres: one for all (global) or slabs along the principal direction
``report``   :class:`GraphReport`

The rest of the package imports this package's names, never its modules (``tests/test_layering.py``).
"""

from knng.engine.graph.blocks import (
    BlockCounts, SharedThresholds, holding_for, off_diagonal_blocks, retry_on_oom, screen_own_part,
    screen_own_parts_together,
)
from knng.engine.graph.frames import GlobalFrames, PrincipalFrames, Tile, slab_gain, slab_gain_of
from knng.engine.graph.report import GraphReport
from knng.engine.graph.symmetric import exact_graph

__all__ = ["exact_graph", "BlockCounts", "SharedThresholds", "holding_for", "off_diagonal_blocks", "retry_on_oom", "screen_own_part", "screen_own_parts_together", "GlobalFrames",
           "PrincipalFrames", "Tile", "slab_gain", "slab_gain_of", "GraphReport"]
