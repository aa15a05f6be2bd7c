"""knng: exact k-nearest-neighbour search and exact k-NN graphs, brute force, on CPU and GPU.

The public entry points are :func:`knng.search` and :func:`knng.graph`; both return
results that follow the input kind (NumPy in, NumPy out; torch in, torch out on the same
device). See ``README.md`` for the exactness promise.
"""

from knng.api import graph, search
from knng.estimators import (
    KNeighborsClassifier, KNeighborsRegressor, KNeighborsTransformer, NearestNeighbors,
)
from knng.results import Graph, Neighbors, load_graph

__all__ = [
    "search", "graph", "Neighbors", "Graph", "load_graph",
    "NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor", "KNeighborsTransformer",
    "__version__",
]
__version__ = "0.1.0"
