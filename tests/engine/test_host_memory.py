"""A host-memory budget (``host_memory_budget=`` / ``--host-memory``): files several times larger
than the budget stream through it, a graph whose candidate stores do not fit runs in bands with
its stores on disk (knng.engine.store.lists), and every answer equals the in-memory one bit for bit.

The memory itself is measured in a subprocess: its peak anonymous memory (``RssAnon``, sampled
every 2 ms) during the call, over what it held before. glibc's dynamic mmap threshold lets the
heap keep freed blocks of up to 32 MiB, which no plan can bound; the measuring process fixes the
threshold (``MALLOC_MMAP_THRESHOLD_``), as ``docs/SCALING.md`` advises for hard ceilings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import knng
import knng.api
from knng.engine.plan import make_graph_plan
from knng.io.workarea import CRASH_ENV
from oracle import assert_exact, oracle_graph, oracle_search

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    """24 MB of float32 (6,000 × 1,000): six times the 4 MB budget; clustered, with duplicates."""
    rng = np.random.default_rng(2026)
    centres = rng.standard_normal((40, 1000)).astype(np.float32) * 3
    x = centres[rng.integers(0, 40, 6000)] + rng.standard_normal((6000, 1000), dtype=np.float32)
    x[10:30] = x[5]   # exact duplicates: ties by index
    x[4000:4010] += 1e4  # far outliers
    path = tmp_path_factory.mktemp("host") / "big.npy"
    np.save(path, x)
    return path


def _in_memory_graph(path: Path, k: int):
    return knng.graph(np.load(path), k, device="cpu")


@pytest.mark.slow
def test_a_graph_over_a_file_six_times_the_budget_equals_the_in_memory_graph(big_file):
    streamed = knng.graph(np.load(big_file, mmap_mode="r"), 5, device="cpu", host_memory_budget="4MB")
    plan = knng.api.last_report().plan
    assert plan.lists == "disk" and plan.bands > 2 and not plan.corpus_resident
    assert plan.host_budget == 4_000_000 and plan.host_bytes_expected <= plan.host_budget
    whole = _in_memory_graph(big_file, 5)
    np.testing.assert_array_equal(streamed.indices, whole.indices)
    np.testing.assert_array_equal(streamed.distances, whole.distances)
    rows = np.r_[0:40, 3990:4020, 5980:6000]
    x = np.load(big_file)
    truth = oracle_search(x[rows], x, 6)
    # The graph excludes each point itself: drop it from the search oracle's rows.
    for r, row in enumerate(rows):
        got = streamed.indices[row]
        assert row not in got
        exact = [c for c in truth.indices[r] if c != row][:5] if row in truth.indices[r] else truth.indices[r][:5]
        np.testing.assert_allclose(streamed.distances[row], np.sort(np.linalg.norm(x[exact].astype(np.float64)
                                                                                   - x[row], axis=1)), rtol=1e-6)


def test_a_search_over_a_file_six_times_the_budget_equals_the_in_memory_search(big_file):
    corpus = np.load(big_file, mmap_mode="r")
    queries = np.array(corpus[::60])
    streamed = knng.search(queries, corpus, 10, device="cpu", host_memory_budget="4MB")
    plan = knng.api.last_report().plan
    assert not plan.corpus_resident and plan.read_rows * 1000 * 8 * 4 <= plan.host_budget
    whole = knng.search(queries, np.load(big_file), 10, device="cpu")
    np.testing.assert_array_equal(streamed.indices, whole.indices)
    np.testing.assert_array_equal(streamed.distances, whole.distances)
    assert_exact(streamed, oracle_search(queries, np.load(big_file), 10))


_MEASURE = textwrap.dedent("""
    import sys, threading, time
    import numpy as np
    import knng

    def anon():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024

    path, budget, what = sys.argv[1], sys.argv[2], sys.argv[3]
    x = np.load(path, mmap_mode="r")
    knng.graph(np.array(x[:300]), 5, device="cpu")  # libraries loaded, thread pools started
    queries = np.array(x[:200])  # the caller's, not the run's
    base = anon()
    peak = [base]
    done = []

    def sample():
        while not done:
            peak[0] = max(peak[0], anon())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    if what == "graph":
        result = knng.graph(x, 5, device="cpu", host_memory_budget=budget)
    else:
        result = knng.search(queries, x, 10, device="cpu", host_memory_budget=budget)
    done.append(1)
    sampler.join()
    print(peak[0] - base)
    np.save(sys.argv[4], result.indices)
""")


@pytest.mark.slow
@pytest.mark.parametrize("what", ["graph", "search"])
def test_the_budget_bounds_the_memory_the_run_holds(tmp_path, big_file, what):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MALLOC_MMAP_THRESHOLD_="131072")
    out = tmp_path / "indices.npy"
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(big_file), "4MB", what, str(out)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    grown = int(run.stdout.split()[-1])
    assert grown <= 4_000_000, f"{what} held {grown / 1e6:.1f} MB over a 4 MB host budget"
    # The same run without a budget holds the whole file (and more): the measurement can fail.
    assert np.load(out).shape[1] == (5 if what == "graph" else 10)


def test_banded_graphs_are_exact_on_adversarial_data(rng):
    """Bands on data with ties, duplicates, an offset, k = n − 1 and include_self, several metrics."""
    x = rng.integers(0, 3, (700, 6)).astype(np.float32) + 1e3  # many exact ties, a large offset
    for metric, k, include_self in [("euclidean", 4, False), ("sqeuclidean", 699, False), ("cosine", 3, True),
                                    ("inner_product", 2, False)]:
        g = knng.graph(x, k, metric=metric, include_self=include_self, device="cpu", host_memory_budget="600kB")
        plan = knng.api.last_report().plan
        # k = n − 1 needs one part of every point (the diagonal block seeds τ): nothing to band.
        assert (plan.lists == "disk" and plan.bands >= 2) or plan.parts == 1, (metric, plan.lists, plan.bands)
        assert_exact(g, oracle_graph(x, k, metric=metric, include_self=include_self), context=metric)


def test_the_planner_places_the_lists_by_both_budgets():
    def plan(device: str, budget: int, host: int):
        return make_graph_plan(n=1_000_000, d=128, k=100, metric="euclidean", device=torch.device(device),
                               budget=budget, include_self=False, screen_dtype="float32", host_budget=host)

    stores = 1_000_000 * (125 * 25 + 40)  # 3.2 GB of candidate stores
    assert plan("cuda", 4 * stores, 64 << 30).lists == "device"
    on_host = plan("cuda", stores, 64 << 30)
    assert on_host.lists == "host" and on_host.bands >= 3 and on_host.frames == "global"
    assert plan("cuda", stores, stores).lists == "disk"
    assert plan("cpu", 2 << 30, 64 << 30).lists == "device"
    on_disk = plan("cpu", 2 << 30, 1 << 30)
    assert on_disk.lists == "disk" and on_disk.budget <= 0.6 * (1 << 30)
    assert on_disk.host_bytes_expected <= on_disk.host_budget


def test_a_banded_graph_killed_mid_run_resumes_bit_for_bit(tmp_path, rng):
    x = (rng.standard_normal((3000, 40)) * [1] * 40).astype(np.float32)
    x[50:60] = x[3]
    path = tmp_path / "x.npy"
    np.save(path, x)
    whole = knng.graph(x, 6, device="cpu")
    ckpt = tmp_path / "ckpt"
    script = (f"import numpy as np, knng; knng.graph(np.load({str(path)!r}, mmap_mode='r'), 6, device='cpu', "
              f"host_memory_budget='1MB', checkpoint={str(ckpt)!r}, checkpoint_interval=0)")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **{CRASH_ENV: "state-written:3"})
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and (ckpt / "state.json").is_file()
    resumed = knng.graph(np.load(path, mmap_mode="r"), 6, device="cpu", host_memory_budget="1MB", checkpoint=ckpt,
                         resume=True, checkpoint_interval=0)
    report = knng.api.last_report()
    assert report.plan.lists == "disk" and report.checkpoints["resumed_from"] >= 2
    np.testing.assert_array_equal(resumed.indices, whole.indices)
    np.testing.assert_array_equal(resumed.distances, whole.distances)
    assert not ckpt.exists()


def test_host_memory_budget_is_checked():
    x = np.zeros((10, 3), np.float32)
    with pytest.raises(ValueError, match="host_memory_budget"):
        knng.graph(x, 2, host_memory_budget="lots")
    with pytest.raises(ValueError, match="host_memory_budget"):
        knng.search(x, x, 2, host_memory_budget=-5)


@pytest.mark.slow
def test_the_cli_streams_a_graph_under_host_memory_and_info_shows_the_plan(tmp_path, rng):
    x = rng.standard_normal((2500, 48)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = [sys.executable, "-m", "knng"]
    run = subprocess.run([*base, "graph", str(tmp_path / "x.npy"), "-k", "4", "--host-memory", "600kB", "--device",
                          "cpu", "--no-progress", "-o", str(tmp_path / "out")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    whole = knng.graph(x, 4, device="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "indices.npy"), whole.indices)
    assert not (tmp_path / ".out.knng-work").exists()
    info = subprocess.run([*base, "info", str(tmp_path / "x.npy"), "-k", "4", "--host-memory", "600kB", "--device",
                           "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "memory-mapped file" in info.stderr + info.stdout and "host memory" in info.stderr + info.stdout
    refused = subprocess.run([*base, "graph", str(tmp_path / "x.npy"), "-k", "4", "--host-memory", "1MB", "--procs",
                              "2", "-o", str(tmp_path / "out2")], env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--host-memory" in refused.stderr
