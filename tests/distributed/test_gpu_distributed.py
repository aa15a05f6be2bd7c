"""The distributed battery on GPUs (NCCL, one process per GPU): identical to one CPU process.

Runs with ``python -m pytest -m gpu`` on a GPU machine: one rank (the engine's per-rank pipeline
on NCCL), and two and four where the machine has them; the CPU reference
(single-device ``knng.graph``/``knng.search`` on the CPU) must equal the GPUs' result bit for
bit, since both are the exact answer.
"""

from __future__ import annotations

import pytest
import torch

import test_distributed as cpu_tests
from test_distributed import RESULT_CASES, run_battery

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("gpu_distributed_battery")]

GPU_WORLDS = tuple(w for w in (1, 2, 4) if torch.cuda.is_available() and w <= torch.cuda.device_count())


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    if not GPU_WORLDS:
        pytest.skip("needs a CUDA GPU")
    return run_battery(tmp_path_factory, GPU_WORLDS, device="cuda")


@pytest.mark.parametrize("world", GPU_WORLDS or (2,))
@pytest.mark.parametrize("name", RESULT_CASES)
def test_gpus_identical_to_one_cpu_process(battery, world, name):
    cpu_tests.test_identical_to_one_process(battery, world, name)


@pytest.mark.parametrize("world", GPU_WORLDS or (2,))
def test_gpus_files_folds_and_bad_input(battery, world):
    for name in ("files", "files-flat", "files-flat-budget"):
        cpu_tests.test_files_written_by_every_rank(battery, world, name)
    for name in cpu_tests.FOLDED:
        cpu_tests.test_identical_rows_fold_on_every_rank(battery, world, name)
    cpu_tests.test_bad_input_is_a_value_error_on_every_rank(battery, world)
    if world > 1:  # properties of a split: blocks balanced over ranks, small budgets streamed on each
        cpu_tests.test_balanced_blocks(battery, world)
        cpu_tests.test_small_budgets_stream_the_data(battery, world)
