"""Benchmark the k-selection algorithms: the quick multi-select paper's experiments and issue 3's bar.

The same run as ``knng bench select`` (this script passes its arguments on unchanged), for a
checkout that is not installed. Experiments (``docs/SELECT_BENCH.md`` describes each):

- ``table2``: Q = 8192 rows, n = 2^13 … 2^16, k = 64 … 512, mean and % std next to the paper's Table 2;
- ``speedup``: speed-up over the insertion-sort baseline, n swept (Fig. 5) and Q swept (Fig. 6);
- ``product``: n · Q = 2^27, log2(n/Q) = −3 … 19, speed-up over the bitonic baseline (Fig. 7);
- ``fixed-n``: n = 2^20, Q = 8 … 256, time per query (Fig. 9);
- ``bar``: 8192 × 65536, k = 64 … 2048, qms against torch.topk (identical sorted output, GB/s,
  % of the copy-bandwidth floor).

Writes ``select.json``, ``select.md`` and ``select-*.png`` (with matplotlib) to ``--out``
(default ``bench-results/select``) after each experiment and prints the markdown summary.

Usage (from the repository root)::

    PYTHONPATH=src python bench/bench_select.py --experiments all --trials 20      # on a GPU
    PYTHONPATH=src python bench/bench_select.py --experiments bar --algorithms qms,topk
    PYTHONPATH=src python bench/bench_select.py --quick --device cpu               # CPU smoke run
    PYTHONPATH=src python bench/bench_select.py --help                             # every option
"""

from __future__ import annotations

import sys

from knng.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "select", *sys.argv[1:]]))
