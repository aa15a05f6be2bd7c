"""The first call of a kind without compiled kernels, and the background worker that compiles
them (``knng.engine.kernels.compiling``, ``knng.engine.plan.first_call_uncompiled``).

The worker and the planner's rule are checked here on any machine; a fresh process on a GPU, with
empty kernel caches, runs the whole story in ``tests/engine/test_gpu.py``.
"""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

import knng
from knng.engine.kernels import (
    DeviceCapabilities, capabilities_of, compile_failures, compile_in_background, compiling, kernels_installed,
    kind_ready, mark_ready, wait_for_kernels,
)
from knng.engine.plan import call_kind, first_call_uncompiled, make_graph_plan, make_search_plan

_KINDS = itertools.count()


def _new_kind() -> tuple:
    """A kind no other test (nor call) has used in this process."""
    return ("test", next(_KINDS), threading.get_ident())


def test_a_kind_compiles_once_in_the_background_with_the_callers_options():
    kind, release, seen = _new_kind(), threading.Event(), []

    def run():
        options = knng.get_options()
        seen.append((options.compiled_kernels, options.background_compile, options.gpu_sample,
                     threading.current_thread().name))
        assert release.wait(30)

    with knng.options(compiled_kernels=False, gpu_sample=123):
        compile_in_background(kind, run)
        compile_in_background(kind, run)  # already compiling: not queued again
    assert compiling(kind) and not kind_ready(kind)
    assert not wait_for_kernels(timeout=0.05)
    release.set()
    assert wait_for_kernels(timeout=30)
    assert kind_ready(kind) and not compiling(kind)
    # The run sees the caller's options, with compiled kernels and no further background work.
    assert seen == [(True, False, 123, "knng-compile")]
    compile_in_background(kind, run)  # ready: nothing runs
    assert wait_for_kernels(timeout=30) and len(seen) == 1


def test_a_failed_compilation_is_kept_and_not_retried():
    kind, calls = _new_kind(), []

    def run():
        calls.append(1)
        raise RuntimeError("nvrtc: no such architecture")

    compile_in_background(kind, run)
    assert wait_for_kernels(timeout=30)
    assert kind_ready(kind)  # the next call of the kind compiles in the foreground, and reports it
    assert compile_failures()[kind] == "RuntimeError: nvrtc: no such architecture"
    compile_in_background(kind, run)
    assert wait_for_kernels(timeout=30) and calls == [1]


def test_runs_queue_behind_each_other_in_order():
    order, release = [], threading.Event()
    first, second = _new_kind(), _new_kind()
    compile_in_background(first, lambda: (release.wait(30), order.append("first")))
    compile_in_background(second, lambda: order.append("second"))
    assert compiling(second) and not kind_ready(second)
    release.set()
    assert wait_for_kernels(timeout=30)
    assert order == ["first", "second"] and kind_ready(first) and kind_ready(second)


def test_the_planner_runs_small_first_calls_of_a_kind_without_compiled_kernels(set_options):
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    set_options(background_compile=True)  # the tests' default is off (tests/conftest.py)
    kind = call_kind("search", gpu, 1000 + next(_KINDS), torch.float32, "euclidean", 10)
    assert kind == ("search", "cuda:0", kind[2], "torch.float32", "euclidean", 10)
    installed = kernels_installed()  # nothing compiles where neither Triton nor CuPy is installed
    assert first_call_uncompiled(kind, scores=10**10, device=gpu) is installed
    assert not first_call_uncompiled(kind, scores=2**36 + 1, device=gpu)  # large: it pays to compile first
    assert not first_call_uncompiled(kind, scores=0, device=gpu)
    assert not first_call_uncompiled(kind, scores=10, device=cpu)  # a CPU compiles nothing
    assert not first_call_uncompiled(kind, scores=10, device=gpu, recorded=True)  # a checkpoint's plan is kept
    with knng.options(uncompiled_max_scores=9):
        assert not first_call_uncompiled(kind, scores=10, device=gpu)
    with knng.options(background_compile=False):
        assert not first_call_uncompiled(kind, scores=10, device=gpu)
    with knng.options(compiled_kernels=False):  # already without them: nothing to decide
        assert not first_call_uncompiled(kind, scores=10, device=gpu)
    mark_ready(kind)  # a call of the kind ran with its kernels
    assert not first_call_uncompiled(kind, scores=10, device=gpu)


@pytest.mark.parametrize("operation", ["search", "graph"])
def test_plans_without_compiled_kernels_use_none_and_say_so(operation):
    hopper, gpu = DeviceCapabilities.hopper(), torch.device("cuda", 0)

    def plan():
        if operation == "search":
            return make_search_plan(n_queries=10_000, n_corpus=1_000_000, d=128, k=10, metric="euclidean",
                                    device=gpu, budget=64 << 30, capabilities=hopper)
        return make_graph_plan(n=200_000, d=128, k=10, metric="euclidean", device=gpu, budget=64 << 30,
                               include_self=False, capabilities=hopper)

    compiled = plan()
    with knng.options(compiled_kernels=False):
        assert capabilities_of(hopper) == DeviceCapabilities("cuda", (9, 0))
        uncompiled = plan()
    assert not compiled.uncompiled and uncompiled.uncompiled
    # The compiled plan screens in float16 with kernels; without them torch's products screen.
    assert compiled.screen_precision == "float16"
    assert uncompiled.screen_precision in ("float32", "float64", "tf32")
    assert not uncompiled.tiles_first
    assert capabilities_of(hopper) == hopper


def test_a_cpu_call_never_runs_uncompiled_nor_compiles_in_the_background(set_options, rng):
    set_options(background_compile=True)
    x = rng.standard_normal((300, 8)).astype("float32")
    before = dict(compile_failures())
    found = knng.search(x[:20], x, 3, device="cpu")
    assert not found.report.plan.uncompiled
    assert wait_for_kernels(timeout=0)  # nothing queued
    assert compile_failures() == before
