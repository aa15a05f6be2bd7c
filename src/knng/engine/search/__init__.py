"""Searches: each query's k nearest corpus vectors, or every corpus vector within a radius.

================ ===================================================================
``direct``       the direct path of small calls: every score in one product, each row's
                 k + m best, a certificate, the exact finish
``knn``          the k-NN search: chunks of queries through the block pipeline (the
                 direct path where the plan says so)
``radius``       radius queries: every pair whose score could be within the radius,
                 evaluated exactly
================ ===================================================================
"""

from knng.engine.search.direct import (
    DIRECT_CENTRE_SAMPLE, DIRECT_MARGIN, DIRECT_SLACK, DIRECT_WIDER, DirectRows, direct_neighbours,
    direct_rounding_bound, product_dtype,
)
from knng.engine.search.knn import SearchReport, SeedSample, exact_search, prepare_corpus, seed_sample
from knng.engine.search.radius import RADIUS_METRICS, RadiusReport, exact_radius, radius_product_dtype

__all__ = [
    "SearchReport", "SeedSample", "exact_search", "prepare_corpus", "seed_sample",
    "DirectRows", "direct_neighbours", "direct_rounding_bound", "DIRECT_MARGIN", "DIRECT_SLACK", "DIRECT_WIDER",
    "DIRECT_CENTRE_SAMPLE", "product_dtype", "RADIUS_METRICS", "RadiusReport", "exact_radius", "radius_product_dtype",
]
