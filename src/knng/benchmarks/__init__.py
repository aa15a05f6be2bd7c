"""Benchmark harnesses behind ``knng bench``.

:mod:`knng.benchmarks.select` times the k-selection algorithms of :mod:`knng.select` on the
experiments of Komarov, Dashti & D'Souza (2014) and on issue 3's acceptance bar; its
:func:`~knng.benchmarks.select.run` is what ``knng bench select`` and ``bench/bench_select.py``
call.
"""
