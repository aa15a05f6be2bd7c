"""knng: exact k-nearest-neighbour search and exact k-NN graphs, brute force, on CPU and GPU.

The public entry points are :func:`knng.search` and :func:`knng.graph`; both return
results that follow the input kind (NumPy in, NumPy out; torch in, torch out on the same
device). See ``README.md`` for the exactness promise.

``import knng`` imports nothing but this file and the version: every public name, and every
sub-package (``knng.io``, ``knng.distributed``, ...), is imported on first use (PEP 562). So a
command that only parses its arguments or describes a file (``knng --help``, ``knng info``) never
pays for torch (about a second), scikit-learn (another) or SciPy; ``docs/STARTUP.md`` has the
figures.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from knng._version import VERSION as __version__

#: Public name → the module that defines it, imported when the name is first used.
_LAZY: dict[str, str] = {
    "search": "knng.api",
    "graph": "knng.api",
    "radius": "knng.api",
    "wait_for_kernels": "knng.api",
    "Neighbors": "knng.results",
    "RadiusNeighbors": "knng.results",
    "Graph": "knng.results",
    "load_graph": "knng.results",
    "NearestNeighbors": "knng.estimators",
    "KNeighborsClassifier": "knng.estimators",
    "KNeighborsRegressor": "knng.estimators",
    "KNeighborsTransformer": "knng.estimators",
    "RadiusNeighborsClassifier": "knng.estimators",
    "RadiusNeighborsRegressor": "knng.estimators",
    "RadiusNeighborsTransformer": "knng.estimators",
    "DiffusionMap": "knng.manifold",
    "KnngPerformanceWarning": "knng.engine.plan",
    "options": "knng._options",
    "get_options": "knng._options",
    "Options": "knng._options",
}

#: Sub-modules reachable as attributes (``knng.api.last_report()``) without importing them first.
_SUBMODULES = frozenset({
    "api", "arguments", "cli", "demo", "demo_embed", "distributed", "engine", "estimators", "io", "manifold",
    "metrics", "plotting", "reports", "results", "select",
})

__all__ = [
    "search", "graph", "radius", "wait_for_kernels", "Neighbors", "Graph", "RadiusNeighbors", "load_graph",
    "NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor", "KNeighborsTransformer",
    "RadiusNeighborsClassifier", "RadiusNeighborsRegressor", "RadiusNeighborsTransformer", "DiffusionMap", "KnngPerformanceWarning", "options", "get_options", "Options", "__version__",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these come from __getattr__
    from knng.api import graph, radius, search, wait_for_kernels
    from knng.engine.plan import KnngPerformanceWarning
    from knng._options import Options, get_options, options
    from knng.estimators import (
        KNeighborsClassifier, KNeighborsRegressor, KNeighborsTransformer, NearestNeighbors,
        RadiusNeighborsClassifier, RadiusNeighborsRegressor, RadiusNeighborsTransformer,
    )
    from knng.manifold import DiffusionMap
    from knng.results import Graph, Neighbors, RadiusNeighbors, load_graph


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"knng.{name}")
    raise AttributeError(f"module 'knng' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
