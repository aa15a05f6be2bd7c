"""knng's options (``knng.options``, ``knng.get_options``): one frozen object, set for a block,
nesting, checked, and read by the engine where it acts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import knng
from knng.metrics import PRECISIONS


def test_defaults_are_the_configuration_users_run():
    o = knng.get_options()
    assert o == knng.Options()
    assert o.fold_duplicates and o.screen_precision is None and o.tiles_first and o.tighten_on == {"cuda"}
    assert not o.sort_interpreted


def test_options_nest_and_are_undone(set_options):
    set_options(hold_pairs=False)  # this test's own (set_options, the fixture the tests use)
    with knng.options(screen_precision="float64") as outer:
        assert outer.screen_precision == "float64" and not outer.hold_pairs
        with knng.options(screen_precision="float32", tiles_first=False) as inner:
            assert knng.get_options() is inner and inner.screen_precision == "float32"
        assert knng.get_options().screen_precision == "float64" and knng.get_options().tiles_first
    assert knng.get_options().screen_precision is None and not knng.get_options().hold_pairs
    with pytest.raises(RuntimeError), knng.options(mark_candidates=False):
        raise RuntimeError("undone on the way out too")
    assert knng.get_options().mark_candidates


def test_bad_options_are_refused_naming_them():
    with pytest.raises(TypeError, match="unknown option.*fold_duplicate\\b.*knng's options are"):
        with knng.options(fold_duplicate=False):
            pass
    with pytest.raises(TypeError, match="tiles_first must be True or False, got 1"):
        with knng.options(tiles_first=1):
            pass
    with pytest.raises(ValueError, match="screen_precision must be None or one of"):
        with knng.options(screen_precision="float8"):
            pass
    with pytest.raises(TypeError, match="tighten_on must be a set of device types"):
        with knng.options(tighten_on="cuda"):
            pass
    with pytest.raises(AttributeError):
        knng.get_options().fold_duplicates = False  # frozen
    assert knng.get_options() == knng.Options()  # the defaults: nothing changed them


def test_the_screen_precisions_are_the_metrics(rng):
    from knng._options import SCREEN_PRECISIONS

    assert SCREEN_PRECISIONS == set(PRECISIONS)


def test_the_engine_runs_the_options_in_force(rng):
    x = rng.standard_normal((600, 8)).astype(np.float32)
    x[:40] = x[0]  # a group of identical rows large enough to fold
    with knng.options(fold_duplicates=False):
        ref = knng.graph(x, 5, device="cpu")
    for precision in ("float64", "float32", "int8x4"):
        with knng.options(screen_precision=precision, fold_duplicates=False):
            g = knng.graph(x, 5, device="cpu")
        assert g.report.screen_dtype == precision
        np.testing.assert_array_equal(g.indices, ref.indices)
        np.testing.assert_array_equal(g.distances, ref.distances)
    with knng.options(direct_max_scores=0, direct_max_scores_gpu=0):
        folded = knng.graph(x, 5, device="cpu")  # the pipeline folds by default
    assert folded.report.duplicates_folded == 39 and ref.report.duplicates_folded == 0
    np.testing.assert_array_equal(folded.indices, ref.indices)
    direct = knng.graph(x, 5, device="cpu")  # a call this small takes the direct path, which does not fold
    assert direct.report.plan.direct and direct.report.duplicates_folded == 0
    np.testing.assert_array_equal(direct.indices, ref.indices)


def test_options_belong_to_the_thread_that_set_them():
    seen = {}
    started, release = threading.Event(), threading.Event()

    def other() -> None:
        started.set()
        release.wait(10)
        seen["other"] = knng.get_options().screen_precision

    thread = threading.Thread(target=other)
    thread.start()
    started.wait(10)
    with knng.options(screen_precision="float64"):
        release.set()
        thread.join(10)
        seen["mine"] = knng.get_options().screen_precision
    assert seen == {"other": None, "mine": "float64"}


def test_sizes_and_kernels_are_checked_and_kernels_add_up():
    with pytest.raises(TypeError, match="cpu_max_part must be an integer, got 1.5"):
        with knng.options(cpu_max_part=1.5):
            pass
    with pytest.raises(ValueError, match="pending_cpu must be at least 0"):
        with knng.options(pending_cpu=-1):
            pass
    with pytest.raises(ValueError, match="kernels: unknown kernel.*'fused'.*the kernels are"):
        with knng.options(kernels={"fused": True}):
            pass
    with pytest.raises(TypeError, match="group_parts must be None or an integer"):
        with knng.options(group_parts="3"):
            pass
    with knng.options(kernels={"row_kth": False}):
        with knng.options(kernels={"radius": False}) as inner:
            assert dict(inner.kernels) == {"row_kth": False, "radius": False}
        with pytest.raises(TypeError):
            inner.kernels["triton"] = True  # read-only, as the options are


def test_the_chunk_seed_limit_and_its_option_agree():
    # Options.whole_by_smallest_min_k starts where a GPU's seeds stop being chunk minima.
    from knng.engine.thresholds import GPU_CHUNK_SEED_MAX_K

    assert knng.Options().whole_by_smallest_min_k == GPU_CHUNK_SEED_MAX_K + 1


def test_small_sizes_give_the_same_graph(rng):
    # Every size is a speed choice: a graph in small parts, small pending batches and tiny
    # stores is the same exact graph.
    x = rng.standard_normal((700, 6))
    x[100:150] = x[:50]
    ref = knng.graph(x, 7, device="cpu")
    with knng.options(cpu_max_part=97, pending_cpu=50, store_extra=0, cpu_sample=16, pending_pair_bytes=1):
        small = knng.graph(x, 7, device="cpu")
    np.testing.assert_array_equal(small.indices, ref.indices)
    np.testing.assert_array_equal(small.distances, ref.distances)


def test_every_option_is_documented_and_every_kernel_name_is_asked():
    # The Options docstring is the one place a user reads what each setting does; and a kernel
    # name that no "does it run here" question reads would be accepted and do nothing.
    import dataclasses
    import re
    from pathlib import Path

    from knng._options import KERNELS

    doc = knng.Options.__doc__
    undocumented = [f.name for f in dataclasses.fields(knng.Options)
                    if not re.search(rf"^\s+(\w+, )*{f.name}(, \w+)* :", doc, re.M)]
    assert not undocumented, f"Options fields without an entry in its docstring: {undocumented}"
    source = "\n".join(p.read_text() for p in Path(knng.__file__).parent.rglob("*.py"))
    asked = set(re.findall(r'kernel_forced\("(\w+)"\)', source))
    assert asked == KERNELS, (sorted(KERNELS - asked), sorted(asked - KERNELS))
