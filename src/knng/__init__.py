"""knng: exact k-nearest-neighbour search and exact k-NN graphs, brute force, on CPU and GPU.

The public entry points are :func:`knng.search` and :func:`knng.graph`; both return
results that follow the input kind (NumPy in, NumPy out; torch in, torch out on the same
device). See ``README.md`` for the exactness promise.
"""

from typing import Any

from knng.api import graph, search
from knng.results import Graph, Neighbors, load_graph

#: The scikit-learn estimators (and DiffusionMap, from knng.manifold), imported on first use:
#: scikit-learn takes about a second to import, which every ``knng`` command would otherwise pay
#: without using it.
_ESTIMATORS = ("NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor", "KNeighborsTransformer")

__all__ = [
    "search", "graph", "Neighbors", "Graph", "load_graph",
    "NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor", "KNeighborsTransformer",
    "DiffusionMap", "__version__",
]
from knng._version import VERSION as __version__  # noqa: E402


def __getattr__(name: str) -> Any:
    if name in _ESTIMATORS:
        from knng import estimators

        return getattr(estimators, name)
    if name == "DiffusionMap":
        from knng import manifold

        return manifold.DiffusionMap
    raise AttributeError(f"module 'knng' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ESTIMATORS) | {"DiffusionMap"})
