"""A host budget that makes a plan much slower says so before the work starts.

A reliability battery ran ``knng graph x.npy -k 10 --host-memory 1MB`` on a 4 MB file (16,384 ×
64 float32) for 782 s where it took 8 s without the option, and nothing told the user why. The
planner now compares the plan with the one the default host budget gives (its cost model:
``knng.engine.plan.estimated_seconds``), records a note on the plan where it is more than
``HOST_BUDGET_SLOWDOWN`` times slower, naming the blocks, passes over the data and bands that
cost it and the budgets that avoid it, and ``knng.search`` / ``knng.graph`` issue that note as a
:class:`~knng.engine.plan.KnngPerformanceWarning`; ``knng info`` prints it with the plan.

The planner's decisions are tested on the reproducing shapes without running them; the calls
that run are small.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import knng
import knng.api
import knng.engine.plan
from knng._units import parse_bytes
from knng.cli import main
from knng.engine.plan import (
    HOST_BUDGET_SLOWDOWN, HOST_BUDGET_WITHIN, EnginePlan, KnngPerformanceWarning,
    estimated_seconds, make_graph_plan, make_search_plan, resolve_host_budget,
)

CPU = torch.device("cpu")
#: The default CPU budget's cap (knng.engine.plan.CPU_BUDGET_CAP): what knng.graph plans with on
#: any machine with 8 GiB of RAM available, so that the reference plan does not vary here.
BUDGET = 2 * 2**30


def _graph_plan(host: str | int | None, n: int = 16384, d: int = 64, k: int = 10) -> EnginePlan:
    """The plan knng.graph makes on a CPU (knng.api passes these arguments)."""
    return make_graph_plan(n=n, d=d, k=k, metric="euclidean", device=CPU, budget=BUDGET, include_self=False,
                           host_budget=resolve_host_budget(host))


def _search_plan(host: str | int | None, n_queries: int = 2000, n_corpus: int = 16384, d: int = 64) -> EnginePlan:
    return make_search_plan(n_queries=n_queries, n_corpus=n_corpus, d=d, k=10, metric="euclidean", device=CPU,
                            budget=BUDGET, host_budget=resolve_host_budget(host))


def _suggestions(note: str) -> list[int]:
    """The budgets a note suggests, in bytes, smallest first."""
    return [parse_bytes(s) for s in re.findall(r"host_memory_budget=(\S+) or more", note)]


def _slowdown(plan: EnginePlan) -> float:
    return estimated_seconds(plan) / estimated_seconds(_graph_plan(None, plan.n_corpus, plan.d, plan.k)
                                                       if plan.operation == "graph" else
                                                       _search_plan(None, plan.n_queries, plan.n_corpus, plan.d))


def test_the_reproducing_graph_gets_a_note_naming_its_blocks_passes_and_bands():
    plan = _graph_plan("1MB")
    note = plan.host_budget_note
    assert _slowdown(plan) > HOST_BUDGET_SLOWDOWN
    assert note.startswith("host_memory_budget=1MB makes this graph about ")
    assert f"{plan.blocks:,} score blocks of {plan.part_size} × {plan.part_size}" in note
    assert "the data read" in note and f"on disk in {plan.bands} bands" in note
    assert len(_suggestions(note)) == 2


def test_no_note_without_a_host_budget_or_with_a_generous_one():
    assert _graph_plan(None).host_budget_note == ""
    assert _graph_plan("64MB").host_budget_note == ""
    assert _graph_plan(resolve_host_budget(None)).host_budget_note == ""
    assert _search_plan(None).host_budget_note == ""
    assert _search_plan("64MB").host_budget_note == ""


@pytest.mark.parametrize("host", ["1MB", "2MB", "600KB", "1MiB"])
def test_the_suggested_budgets_give_plans_without_the_note(host):
    plan = _graph_plan(host)
    assert plan.host_budget_note
    smallest, within = _suggestions(plan.host_budget_note)
    assert plan.host_budget < smallest < within
    assert _graph_plan(smallest).host_budget_note == ""
    assert _slowdown(_graph_plan(smallest)) <= HOST_BUDGET_SLOWDOWN
    assert _slowdown(_graph_plan(within)) <= HOST_BUDGET_WITHIN
    # Round budgets about 25 % apart: the one before the smallest still gets the note.
    assert _graph_plan(int(smallest * 0.8)).host_budget_note


def test_a_search_whose_corpus_streams_in_tiny_chunks_gets_the_note():
    plan = _search_plan("1MB")
    assert _slowdown(plan) > HOST_BUDGET_SLOWDOWN
    assert plan.host_budget_note.startswith("host_memory_budget=1MB makes this search about ")
    assert "the corpus read" in plan.host_budget_note
    smallest = _suggestions(plan.host_budget_note)[0]
    assert _search_plan(smallest).host_budget_note == ""


def test_a_small_call_that_a_budget_slows_by_a_fraction_of_a_second_gets_no_note(set_options):
    plan = _graph_plan("1MB", n=2048)  # ~0.3 s against ~0.07 s on one core
    assert _slowdown(plan) > HOST_BUDGET_SLOWDOWN
    assert estimated_seconds(plan) < knng.get_options().host_budget_min_seconds and plan.host_budget_note == ""
    set_options(host_budget_min_seconds=0.0)
    assert _graph_plan("1MB", n=2048).host_budget_note


def test_plans_without_the_field_still_load_and_the_note_survives_json():
    plan = _graph_plan("1MB")
    saved = json.loads(json.dumps(plan.as_dict()))
    assert EnginePlan.from_dict(saved) == plan
    older = {key: value for key, value in saved.items() if key != "host_budget_note"}
    assert EnginePlan.from_dict(older).host_budget_note == ""


@pytest.fixture
def small_file(tmp_path: Path, rng, set_options) -> Path:
    """1,024 × 64 points in a file, and no floor under the slowdown worth a warning (their calls
    take a fraction of a second however slow their plan)."""
    set_options(host_budget_min_seconds=0.0)
    path = tmp_path / "x.npy"
    np.save(path, rng.standard_normal((1024, 64), dtype=np.float32))
    return path


def test_graph_warns_once_before_a_slow_plan_and_still_answers_exactly(small_file):
    with pytest.warns(KnngPerformanceWarning, match=r"host_memory_budget=1MB .* or more") as record:
        slow = knng.graph(np.load(small_file, mmap_mode="r"), 5, device="cpu", host_memory_budget="1MB")
    assert len([w for w in record if issubclass(w.category, KnngPerformanceWarning)]) == 1
    assert record[0].filename == __file__  # points at the caller's line
    assert knng.api.last_report().plan.host_budget_note == str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KnngPerformanceWarning)
        whole = knng.graph(np.load(small_file), 5, device="cpu")
        generous = knng.graph(np.load(small_file, mmap_mode="r"), 5, device="cpu", host_memory_budget="64MB")
    np.testing.assert_array_equal(slow.indices, whole.indices)
    np.testing.assert_array_equal(generous.indices, whole.indices)


def test_search_warns_before_a_slow_plan(small_file):
    corpus = np.load(small_file, mmap_mode="r")
    queries = np.array(corpus[:50])
    with pytest.warns(KnngPerformanceWarning, match="host_memory_budget=256KB makes this search"):
        knng.search(queries, corpus, 5, device="cpu", host_memory_budget="256KB")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KnngPerformanceWarning)
        knng.search(queries, corpus, 5, device="cpu")


def test_knng_info_prints_the_note_with_the_plan(tmp_path, capsys):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((16384, 64), dtype=np.float32) + np.arange(16384, dtype=np.float32)[:, None])
    assert main(["info", str(path), "-k", "10", "--host-memory", "1MB", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("warning"))
    assert "host_memory_budget=1MB makes this graph about" in line
    assert main(["info", str(path), "-k", "10", "--device", "cpu"]) == 0
    assert "host_memory_budget=" not in capsys.readouterr().out
