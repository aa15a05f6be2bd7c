"""The names the parser offers as choices, kept here so that building it imports no torch.

They are copies: :data:`METRIC_NAMES` of ``knng.metrics.METRICS``, :data:`SELECT_NAMES` of
``knng.select.available()``, the ``EMBED_*`` names of :mod:`knng.manifold`'s ``METRICS``,
``EPSILON_RULES`` and ``EIGEN_SOLVERS``. Importing those modules costs torch (a second) or
scikit-learn (another), which ``knng --help`` must not pay; ``tests/cli/test_cli.py`` checks that the
copies agree with the originals.
"""

from __future__ import annotations

__all__ = ["METRIC_NAMES", "SELECT_NAMES", "EMBED_METRICS", "EMBED_EPSILON_RULES", "EMBED_EIGEN_SOLVERS"]

METRIC_NAMES = ("euclidean", "sqeuclidean", "cosine", "pearson", "inner_product")
SELECT_NAMES = ("auto", "batch_sort", "bitonic", "grouped", "insertion", "qms", "qms_block", "qms_sampled",
                "qms_warp", "topk")
EMBED_METRICS = ("euclidean", "sqeuclidean", "cosine", "pearson")
EMBED_EPSILON_RULES = ("auto", "bgh", "self_tuning")
EMBED_EIGEN_SOLVERS = ("auto", "scipy", "torch")
