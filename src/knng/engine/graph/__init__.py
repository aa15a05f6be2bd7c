"""The exact k-NN graph of one device's data.

``blocks``   the graph by symmetric blocks: each point's own part first (its seeds), then every
             block S(I, J), I < J, once for both sides; in bands of parts where the stores do
             not fit the device; :func:`exact_graph`, which also dispatches to the rows method
``rows``     the graph by rows: the data searched against themselves for k + 1 neighbours
``frames``   the blocks' centres: one for all (global) or slabs along the principal direction
``report``   :class:`GraphReport`

The rest of the package imports this package's names, never its modules (``tests/test_layering.py``).
"""

from knng.engine.graph.blocks import exact_graph, retry_on_oom, screen_own_part, screen_own_parts_together
from knng.engine.graph.frames import GlobalFrames, PrincipalFrames, Tile, slab_gain, slab_gain_of
from knng.engine.graph.report import GraphReport

__all__ = ["exact_graph", "retry_on_oom", "screen_own_part", "screen_own_parts_together", "GlobalFrames",
           "PrincipalFrames", "Tile", "slab_gain", "slab_gain_of", "GraphReport"]
