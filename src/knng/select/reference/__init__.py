"""NumPy references of the k-selection kernels, on the CPU, in the order of :mod:`knng.select.keys`.

Each module here restates one algorithm from the papers step by step, vectorized over rows, so
that a GPU kernel can be tested against the same sequence of operations and both against
:func:`knng.select.keys.select_reference`. Every row function has the selection signature
``fn(values: np.ndarray, k: int) -> (values, indices)``: a row's k smallest entries, ascending,
the block's own float32 values and int64 column indices.

* :mod:`.qms` — the quick multi-select (Komarov et al. 2014): the warp/block partition step
  by step, the pass loop with its stack of references, and knng's sampled single-pass variant.
* :mod:`.baselines` — the historical baselines: per-row insertion sort (Garcia et al. 2008,
  Nolan 2009), truncated bitonic sort (Sismanis et al. 2012), batch index sorting (Dashti 2013).
"""
