"""The help texts of the ``knng`` command line: what each command does, and examples.

Plain strings only: the parser is built from them without importing anything heavy.
"""

from __future__ import annotations

__all__ = [
    "MAIN_DESCRIPTION", "MAIN_EPILOG", "SEARCH_DESCRIPTION", "SEARCH_EXAMPLES", "GRAPH_DESCRIPTION",
    "GRAPH_EXAMPLES", "EMBED_DESCRIPTION", "EMBED_EXAMPLES", "INFO_DESCRIPTION", "INFO_EXAMPLES",
    "DEMO_DESCRIPTION", "DEMO_EXAMPLES", "BENCH_DESCRIPTION", "formats_text",
]


def formats_text() -> str:
    """The table of supported file formats, for the epilog of every command."""
    from knng.io.readers import FORMATS

    width = max(len(s) for s in FORMATS)
    lines = ["supported file formats (by suffix):"]
    for suffix, text in FORMATS.items():
        lines.append(f"  {suffix:<{width}}  {text}")
    return "\n".join(lines)

MAIN_DESCRIPTION = """\
knng: exact k-nearest-neighbour search and exact k-NN graphs, brute force, on a GPU or the CPU.
Exact means: the k neighbours are those of the float64 distances computed directly from your
vectors, ties going to the smaller index. Start with `knng demo`, look at a file with
`knng info FILE`, then run `knng search` or `knng graph`.
"""

MAIN_EPILOG = """\
examples:
  knng demo                                 # built-in data, verified against an oracle
  knng info sift-128-euclidean.hdf5         # what is in a file, and how knng would run it
  knng search sift-128-euclidean.hdf5 -k 10 --check
  knng search base.fvecs queries.fvecs -k 100 -o results/
  knng graph vectors.npy -k 15 --format npz
  knng embed images.npy -k 32 --components 10 -o embedding/   # diffusion map

Run `knng COMMAND --help` for the options of each command.
"""

SEARCH_DESCRIPTION = """\
Find, for every vector in QUERIES, its k nearest vectors in CORPUS, exactly. Results go to
DIR/indices.npy (int64, n_queries × k, row numbers into CORPUS), DIR/distances.npy (float32,
ascending) and DIR/knng.json (what was run, timings and the engine's report); they are written
only when the computation has finished. An ann-benchmarks HDF5 file on its own searches its
`test` set in its `train` set with the file's metric (angular → cosine); add --check to
compare with the file's ground truth `neighbors`.
"""

SEARCH_EXAMPLES = """\
examples:
  knng search glove-100-angular.hdf5 -k 10 --check
  knng search base.fvecs queries.fvecs -k 100 -o results/
  knng search data.hdf5:train data.hdf5:test -k 10 --metric inner_product --device cuda:1
"""

GRAPH_DESCRIPTION = """\
Build the exact k-nearest-neighbour graph of DATA: row i lists the k nearest other points of
point i (the point itself is excluded by index, duplicates stay; --include-self counts it).
Only about half of the distance matrix is computed, since it is symmetric. Results go to
DIR/indices.npy, DIR/distances.npy and DIR/knng.json, or with --format npz to DIR/graph.npz
(load it with knng.load_graph) and DIR/knng.json.
"""

GRAPH_EXAMPLES = """\
examples:
  knng graph vectors.npy -k 15
  knng graph mnist-784-euclidean.hdf5 -k 10 --format npz -o mnist-graph/
"""

EMBED_DESCRIPTION = """\
Embed DATA with a diffusion map (knng.DiffusionMap) on its exact k-NN graph: a kernel exp(−d²/ε)
on the union of the k-NN relations, up to 40 a point (ε from the points' 5th-neighbour distances
unless given; the Berry–Giannakis–Harlim criterion with --epsilon bgh), the α normalisation (1: Laplace–Beltrami, the default) and the leading non-trivial
eigenvectors ψ of the diffusion matrix, scaled by λᵗ, as coordinates (docs/MANIFOLD.md). Results
go to DIR/embedding.npy (float64, n × M), DIR/eigenvalues.npy (λ₁ … λ_M), DIR/knng.json (what
was run; the report: ε, every computed eigenvalue with its residual, the spectral gap, the time
split graph / kernel / eigensolver) and DIR/embedding.png (ψ₁ against ψ₂ and ψ₃, coloured by
--labels or by a coordinate; needs matplotlib), committed together once all are computed.
"""

EMBED_EXAMPLES = """\
examples:
  knng embed images.npy -k 32 --components 10 -o embedding/
  knng embed vectors.fvecs -k 15 --components 3 --labels labels.txt --epsilon self_tuning
  knng embed data.hdf5:train -k 64 --components 5 --alpha 0.5 --t 2 --device cuda
"""

INFO_DESCRIPTION = """\
Describe a vector file without reading its data: shape, dtype, size, format and whether it is
memory-mapped (HDF5: every dataset and the distance attribute). Then say what knng would do
with it: the device that --device auto picks, the memory budget, the tile plan for a k-NN graph
(and for ann-benchmarks files the search of `test` in `train`), whether the data stays resident
or streams through in tiles, and how large the outputs will be.
"""

INFO_EXAMPLES = """\
examples:
  knng info base.fvecs
  knng info sift-128-euclidean.hdf5 -k 100 --memory-budget 8GB
  knng info data.hdf5:test
"""

DEMO_DESCRIPTION = """\
Build exact k=10 graphs of two built-in real data sets (scikit-learn's digits and the 8×8
patches of scikit-image's camera photograph), time them, verify every row (or a random sample
of 2000 rows on large data) against a float64 oracle computed by differences, and show how many
rows the plain float32 expansion ‖x‖²+‖y‖²−2xᵀy gets wrong on the same data. Needs no files;
the patches need scikit-image (pip install -e ".[demo]" in a clone of knng). With --embed: the diffusion-map demo
instead (snapshots of a rotated picture come out as a circle whose angle is the rotation, a swiss
roll unrolls), with its checks and plots.
"""

DEMO_EXAMPLES = """\
examples:
  knng demo --quick
  knng demo --device cuda -o /tmp/knng-demo
  knng demo --embed
"""


BENCH_DESCRIPTION = """\
The benchmark harnesses are not part of the installed package: they live in the bench/ folder of
knng's source repository and run from a checkout. `knng bench select` used to run the
k-selection experiments of Komarov, Dashti & D'Souza (2014) and issue 3's bar; run them with

  python bench/bench_select.py --quick --device cpu        # a smoke run
  python bench/bench_select.py --experiments all --trials 20

(docs/SELECT_BENCH.md describes every experiment; `python bench/bench_select.py --help` every option).
"""
