"""Tests for the k-selection benchmark harness (``bench/select_harness.py``, run by ``bench/bench_select.py``).

The harness lives outside the installed package; these tests import it from ``bench/``, as the
script does.

Everything runs on the CPU with the quick grids (rows ≤ 64, cols ≤ 2048, k ≤ 32) and a small
set of algorithms, so the whole file takes seconds. Fake algorithms registered for one test
(with monkeypatch) stand in for slow, failing or unavailable GPU kernels.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from knng.cli import main as knng_main
from knng.select import registry

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_select  # noqa: E402  (bench/bench_select.py: the harness's command line)
import select_harness as harness  # noqa: E402
from select_harness import EXPERIMENTS, ROW_KEYS, Bench, buffer_count, run, timing_stats  # noqa: E402

main = bench_select.main

TOP_LEVEL_KEYS = {
    "schema", "device", "device_type", "torch_version", "cuda_version", "knng_version", "date", "command",
    "quick", "trials", "seed", "cell_budget_s", "hard_cap_s", "memory_fraction", "timer", "l2_cache_bytes",
    "copy_bandwidth", "peers", "algorithms", "experiments", "plots", "plots_note",
}
EXPERIMENT_KEYS = {"name", "title", "paper", "sorted", "reference", "algorithms", "skipped_algorithms", "grid",
                   "rows"}
FAST = ["topk", "grouped"]


def _quick(tmp_path: Path, experiments: str = "bar", **kwargs) -> dict:
    options = {"device": "cpu", "quick": True, "trials": 3, "out_dir": tmp_path, "algorithms": FAST,
               "progress": False, "cell_budget_s": 0.05}
    return run(experiments, **{**options, **kwargs})


@pytest.fixture
def fake_algorithm(monkeypatch: pytest.MonkeyPatch):
    """``fake_algorithm(name, fn)`` registers ``fn`` under ``name`` for one test."""
    def add(name: str, fn) -> str:
        monkeypatch.setitem(registry._REGISTRY, name, fn)
        return name
    return add


# --- statistics and helpers -----------------------------------------------------------------


def test_timing_stats_on_known_numbers() -> None:
    stats = timing_stats([0.001, 0.002, 0.003, 0.004])  # seconds
    assert stats["mean_ms"] == pytest.approx(2.5)
    # sample std of 1, 2, 3, 4 is sqrt(5/3) = 1.2909944…; 100 · 1.2909944 / 2.5
    assert stats["std_pct"] == pytest.approx(51.63977794943222)
    assert stats["median_ms"] == pytest.approx(2.5)
    assert (stats["min_ms"], stats["max_ms"], stats["trials"]) == (pytest.approx(1.0), pytest.approx(4.0), 4)
    one = timing_stats([0.25])
    assert one["mean_ms"] == pytest.approx(250.0) and one["std_pct"] == 0.0 and one["trials"] == 1
    with pytest.raises(ValueError, match="times_s"):
        timing_stats([])


def test_buffer_count_alternates_copies_of_blocks_that_fit_the_cache() -> None:
    l2 = 50 * 2**20
    assert buffer_count(4 * l2, l2) == 1
    assert buffer_count(2 * l2, l2) == 2
    assert buffer_count(l2, l2) == 4
    assert buffer_count(1024, l2) == harness.MAX_BUFFERS
    assert buffer_count(10**9, None) == 2  # cache size unknown (a CPU): still two copies


# --- the quick run ----------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    results = _quick(tmp_path, "all")
    data = json.loads((tmp_path / "select.json").read_text())
    assert set(data) == TOP_LEVEL_KEYS and data["schema"] == harness.SCHEMA
    assert data["device_type"] == "cpu" and data["quick"] is True and data["trials"] == 3
    assert data["copy_bandwidth"]["read_plus_write_bytes_per_s"] == pytest.approx(
        2 * data["copy_bandwidth"]["read_bytes_per_s"])
    assert set(data["peers"]) == {"cuvs", "raft", "faiss"}
    assert list(data["experiments"]) == list(EXPERIMENTS)
    for name, exp in data["experiments"].items():
        assert set(exp) == EXPERIMENT_KEYS, name
        assert exp["rows"], name
        for row in exp["rows"]:
            assert set(ROW_KEYS) <= set(row), (name, row)
            assert row["status"] == "ok", row
            assert row["trials"] >= 1 and row["mean_ms"] > 0 and row["buffers"] == 2
        timed = {row["algorithm"] for row in exp["rows"]}
        assert set(FAST) <= timed
    speedup = data["experiments"]["speedup"]
    assert speedup["reference"] == "insertion" and speedup["algorithms"][0] == "insertion"
    assert {row["sweep"] for row in speedup["rows"]} == {"a", "b"}
    assert all(row["speedup"] > 0 for row in speedup["rows"])
    product = data["experiments"]["product"]
    assert all(row["rows"] * row["cols"] == 2**15 and row["k"] <= row["cols"] for row in product["rows"])
    assert {row["log2_ratio"] for row in product["rows"]} == {3, 7}
    for row in data["experiments"]["fixed-n"]["rows"]:
        assert row["us_per_query"] == pytest.approx(1e3 * row["mean_ms"] / row["rows"])
    for row in data["experiments"]["bar"]["rows"]:
        assert row["identical"] is True and row["values_equal"] and row["indices_equal"]
        assert row["gb_per_s"] > 0 and row["pct_of_floor"] > 0 and row["topk_over_this"] > 0

    markdown = (tmp_path / "select.md").read_text()
    for heading in ("# k-selection benchmarks", "## Table 2", "| n | k = 4 | paper | k = 32 | paper |",
                    "### (a) Q = 64, n swept", "### (b) n = 2048, Q swept", "speed-up over bitonic",
                    "µs per query", "| k | algorithm | mean ms ± % std | topk / this | identical to torch.topk"):
        assert heading in markdown, heading
    assert markdown == harness.render_markdown(results)
    if data["plots"]:
        assert data["plots_note"] is None
        for file_name in data["plots"].values():
            assert (tmp_path / file_name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib" in data["plots_note"] and "matplotlib" in markdown
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_table2_shows_the_papers_values_on_the_full_grid() -> None:
    exp = {"grid": harness.FULL_GRIDS["table2"], "algorithms": ["qms"], "rows": [
        {"algorithm": "qms", "rows": 8192, "cols": 2**16, "k": 512, "status": "ok", "mean_ms": 12.5, "std_pct": 0.4}]}
    lines = harness._md_table2(exp, {})
    row_16 = next(line for line in lines if line.startswith("| 2^16 |"))
    row_15 = next(line for line in lines if line.startswith("| 2^15 |"))
    assert row_16.endswith("| 12.50 ± 0.4 % | 311.8 ± 0.26 % |")  # ours next to the paper's, verbatim
    assert row_15.endswith("|  | 232.10 ± 0.245 % |")  # no measurement of ours there


def test_plots_skipped_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib…` fail
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    results = _quick(tmp_path)
    assert results["plots"] == {} and "matplotlib" in results["plots_note"]
    assert not list(tmp_path.glob("*.png"))
    assert "matplotlib does not import" in (tmp_path / "select.md").read_text()


def test_plots_written_with_matplotlib(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib.figure")
    results = _quick(tmp_path, "table2,bar")
    assert results["plots"] == {"table2": "select-table2.png", "bar": "select-bar.png"}
    for name in results["plots"].values():
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- skipped, failing and slow algorithms ---------------------------------------------------------


def test_unregistered_algorithm_is_reported_as_skipped(tmp_path: Path) -> None:
    results = _quick(tmp_path, algorithms=["topk", "no_such_select"])
    assert results["algorithms"]["no_such_select"]["status"] == "skipped"
    assert "not registered" in results["algorithms"]["no_such_select"]["reason"]
    bar = results["experiments"]["bar"]
    assert "no_such_select" in bar["skipped_algorithms"]
    assert {row["algorithm"] for row in bar["rows"]} == {"topk"}
    assert "no_such_select (not registered" in (tmp_path / "select.md").read_text()


def test_unavailable_backend_is_skipped_for_the_rest_of_the_run(tmp_path: Path, fake_algorithm) -> None:
    calls = []

    def no_gpu(scores: torch.Tensor, k: int, *, sorted: bool = False):
        calls.append(k)
        raise RuntimeError("qms: the CUDA backend is unavailable on this machine")

    name = fake_algorithm("fake_gpu", no_gpu)
    results = _quick(tmp_path, "table2,bar", algorithms=["topk", name])
    assert calls == [4]  # tried once, then skipped everywhere
    assert results["algorithms"][name]["status"] == "skipped"
    assert "unavailable" in results["experiments"]["bar"]["skipped_algorithms"][name]
    rows = [r for exp in results["experiments"].values() for r in exp["rows"] if r["algorithm"] == name]
    assert [r["status"] for r in rows] == ["skipped"]
    assert all(r["status"] == "ok" for exp in results["experiments"].values() for r in exp["rows"]
               if r["algorithm"] == "topk")


def test_failing_cells_are_recorded_and_the_run_goes_on(tmp_path: Path, fake_algorithm) -> None:
    def broken(scores: torch.Tensor, k: int, *, sorted: bool = False):
        if k == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        raise ValueError("k too large for this kernel")

    name = fake_algorithm("fake_broken", broken)
    results = _quick(tmp_path, algorithms=["topk", name])
    rows = {r["k"]: r for r in results["experiments"]["bar"]["rows"] if r["algorithm"] == name}
    assert rows[4]["status"] == "oom" and "out of memory" in rows[4]["reason"]
    assert rows[32]["status"] == "error" and "k too large" in rows[32]["reason"]
    assert results["algorithms"][name]["status"] == "available"
    markdown = (tmp_path / "select.md").read_text()
    assert f"| 4 | {name} | OOM |" in markdown and f"| 32 | {name} | error |" in markdown


def test_slow_cells_get_fewer_trials_and_over_cap_calls_skip_the_rest(tmp_path: Path, fake_algorithm) -> None:
    def slow(scores: torch.Tensor, k: int, *, sorted: bool = False):
        time.sleep(0.02)
        return torch.topk(scores, k, dim=1, largest=False, sorted=sorted)

    name = fake_algorithm("fake_slow", slow)
    results = _quick(tmp_path, "table2", algorithms=[name], trials=50, cell_budget_s=0.05)
    rows = results["experiments"]["table2"]["rows"]
    assert all(r["status"] == "ok" and 1 <= r["trials"] <= 3 and r["trials_requested"] == 50 for r in rows)
    assert all("trials cut" in r["reason"] for r in rows)

    results = _quick(tmp_path, "table2", algorithms=[name], hard_cap_s=0.01)
    first, *rest = results["experiments"]["table2"]["rows"]
    assert first["status"] == "over_cap" and first["trials"] == 1 and first["mean_ms"] >= 20
    assert rest and all(r["status"] == "skipped" and "hard cap" in r["reason"] for r in rest)
    assert "†" in (tmp_path / "select.md").read_text()


def test_blocks_over_the_memory_share_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "free_memory_bytes", lambda device: 64 * 2**20)
    bench = Bench(torch.device("cpu"), trials=2, quick=True)
    block = harness.Shape(rows=4096, cols=8192, ks=(4,))  # 128 MiB > 40 % of 64 MiB
    rows, skipped = bench.sweep("bar", [block], ["topk"], sort=True)
    assert skipped == {}
    assert [r["status"] for r in rows] == ["skipped"] and "free memory" in rows[0]["reason"]


# --- argument errors --------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"experiments": "tabel2"}, "experiments"),
    ({"experiments": ""}, "experiments"),
    ({"trials": 0}, "trials"),
    ({"trials": 2.5}, "trials"),
    ({"algorithms": " , "}, "algorithms"),
    ({"device": "tpu"}, "device"),
    ({"hard_cap_s": 0}, "hard_cap_s"),
])
def test_bad_arguments_name_the_argument(kwargs: dict, argument: str, tmp_path: Path) -> None:
    options = {"experiments": "bar", "device": "cpu", "quick": True, "out_dir": tmp_path, "progress": False,
               **kwargs}
    with pytest.raises(ValueError, match=argument):
        run(options.pop("experiments"), **options)
    assert not (tmp_path / "select.json").exists()


@pytest.mark.parametrize(("argv", "expected"), [
    (["--experiments", "table3"], ["--experiments", "'table3'", "table2"]),
    (["--trials", "0"], ["--trials", "positive integer"]),
    (["--trials", "many"], ["--trials", "'many'"]),
    (["--algorithms", ","], ["--algorithms"]),
    (["--hard-cap", "-1"], ["--hard-cap"]),
])
def test_cli_bad_arguments(argv: list[str], expected: list[str], tmp_path: Path,
                           capsys: pytest.CaptureFixture) -> None:
    code = main(["--quick", "--device", "cpu", "-o", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for text in expected:
        assert text in err, (text, err)


def test_cli_bad_device_and_missing_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["--quick", "--device", "tpu", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bench_select.py: error:") and "device" in err


def test_knng_bench_says_where_the_harness_is(capsys: pytest.CaptureFixture) -> None:
    for argv in (["bench"], ["bench", "select", "--quick", "--device", "cpu"]):
        assert knng_main(argv) == 2
        err = capsys.readouterr().err
        assert "nothing was run" in err and "bench/bench_select.py" in err and "docs/SELECT_BENCH.md" in err


# --- the command line -------------------------------------------------------------------------


def test_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "results"
    code = main(["--quick", "--device", "cpu", "--experiments", "table2,bar",
                 "--algorithms", "topk", "--trials", "2", "--cell-budget", "0.05", "-o", str(out),
                 "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""  # --no-progress
    assert captured.out.startswith("# k-selection benchmarks") and f"wrote {out / 'select.json'}" in captured.out
    data = json.loads((out / "select.json").read_text())
    assert list(data["experiments"]) == ["table2", "bar"] and data["trials"] == 2
    assert data["command"].startswith("python bench/bench_select.py --quick")
    assert data["experiments"]["bar"]["algorithms"] == ["topk"]
    assert (out / "select.md").read_text() in captured.out


def test_cli_progress_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--quick", "--device", "cpu", "--experiments", "bar", "--algorithms", "topk",
                 "--trials", "1", "-o", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "[select bar] topk 64×2048 k=4:" in err and "[select bar] topk 64×2048 k=32:" in err
