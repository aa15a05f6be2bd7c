"""Shared fixtures: fresh random data each run, with the seed recorded for reproduction.

Every test that takes ``rng`` gets ``np.random.default_rng(seed)`` with a new seed per run
(or ``KNNG_TEST_SEED`` from the environment, to reproduce a failure). The seed is printed,
attached to the test's report as a "knng seed" section, and tests put it in their assertion
messages through the ``seed`` fixture.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# pytest-xdist's workers share the host's cores: each gets its share for torch's threads, which
# wait passively. With every core each, the workers' threads spun against each other (a small
# matrix product on 2 busy cores took 12 ms instead of 44 µs). Set before torch is imported.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# tests/oracle.py is imported as a plain module by the test files.
sys.path.insert(0, str(Path(__file__).parent))

# Without a GPU the fused kernel's tests (test_fused.py) run it in Triton's interpreter, which
# must be chosen before Triton is first imported (its standard library is jitted at import).
# The engine itself never runs the kernel on a CPU, so nothing else changes.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _strict_interpreted_launches() -> None:
    """Make Triton's interpreter refuse a launch keyword that is not one of the kernel's
    parameters, as a GPU's compiler does: the interpreter drops it silently, so a kernel called
    with a constant it does not declare passed here and failed on the first GPU."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    run = InterpretedFunction.run
    options = {"num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "maxnreg"}

    def strict_run(self, *args, grid, warmup, **kwargs):
        unknown = set(kwargs) - set(self.arg_names) - options
        if unknown:
            raise KeyError(f"{self.__name__}: keyword arguments {sorted(unknown)} are not parameters of the kernel")
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = strict_run


def _slicewise_interpreted_reductions() -> None:
    """Run the interpreter's reductions and scans with a combine function it has no NumPy
    shortcut for (``tl.sort``'s ``xor_sum``, the unfolding kernel's running maximum) one slice
    along the axis at a time instead of one element at a time.

    The interpreter's fallback (``ReduceOps.generic_reduce``, ``ScanOps.generic_scan``) calls the
    combine on 1-element tensors, about 0.04 ms an element: one interpreted ``tl.sort`` of a
    16 × 64 block took 2 s, and such loops were most of the time of the row_kth and unfolding
    kernel tests. A combine function is elementwise (on a GPU it combines scalars), so calling
    it on whole slices gives every element the same left fold, in the same order, with the
    accumulator cast back to the input's dtype after each step as the fallback does; the values
    are the fallback's exactly (``tests/test_interpreter_reductions.py`` compares both). A combine
    that does not take blocks (control flow on values) raises here and gets the fallback.
    """
    try:
        import triton.language as tl
        from triton.runtime.interpreter import ReduceOps, ScanOps
    except ImportError:
        return
    if getattr(ReduceOps, "elementwise_generic_reduce", None) is not None:
        return
    element_reduce = ReduceOps.generic_reduce
    element_scan = ScanOps.generic_scan

    def combined(self, acc: list, item: list, inputs, shape: tuple) -> list:
        """One step of the fold: ``combine(acc, item)`` on blocks of ``shape``, each result cast
        to its input's NumPy dtype."""
        acc_t = tuple(self.to_tensor(a, arg.dtype) for a, arg in zip(acc, inputs))
        item_t = tuple(self.to_tensor(x, arg.dtype) for x, arg in zip(item, inputs))
        ret = self.combine_fn.fn(*acc_t, *item_t)
        ret = ret if isinstance(ret, tuple) else (ret,)
        out = []
        for value, arg in zip(ret, inputs):
            data = value.handle.data if isinstance(value, tl.core.tensor) else value
            data = np.asarray(data)
            if data.size != int(np.prod(shape, dtype=np.int64)):
                raise ValueError("the combine did not keep the slice's shape")
            out.append(data.reshape(shape).astype(arg.handle.data.dtype))
        return out

    def slicewise_reduce(self, input):
        original_axis = self.axis
        flat, axis = self.unravel(input, self.axis)
        data = [arg.handle.data for arg in flat]
        shape = data[0].shape
        if data[0].size == 0:
            return element_reduce(self, input)
        axis %= len(shape)
        out_shape = shape[:axis] + shape[axis + 1:]
        try:
            acc = [np.take(d, 0, axis=axis) for d in data]
            for i in range(1, shape[axis]):
                acc = combined(self, acc, [np.take(d, i, axis=axis) for d in data], flat, out_shape)
        except Exception:  # noqa: BLE001 - a combine that needs scalars: the interpreter's own loop
            return element_reduce(self, input)
        ret = []
        for i, value in enumerate(acc):
            if self.keep_dims:
                if original_axis is not None:
                    value = np.expand_dims(value, axis)
                else:
                    for _ in range(len(shape)):
                        value = np.expand_dims(value, 0)
            elif original_axis is None:
                value = value.item()
            ret.append(self.to_tensor(value, flat[i].dtype))
        return ret

    def slicewise_scan(self, input):
        data = [arg.handle.data for arg in input]
        shape = data[0].shape
        if data[0].size == 0:
            return element_scan(self, input)
        axis = self.axis % len(shape)
        out = [np.empty(shape, dtype=d.dtype) for d in data]
        at = lambda i: (slice(None),) * axis + (i,)  # noqa: E731
        slice_shape = shape[:axis] + shape[axis + 1:]
        try:
            acc = [np.array(d[at(0)]) for d in data]
            for o, a in zip(out, acc):
                o[at(0)] = a
            for i in range(1, shape[axis]):
                acc = combined(self, acc, [d[at(i)] for d in data], input, slice_shape)
                for o, a in zip(out, acc):
                    o[at(i)] = a
        except Exception:  # noqa: BLE001 - a combine that needs scalars: the interpreter's own loop
            return element_scan(self, input)
        return [self.to_tensor(o, arg.dtype) for o, arg in zip(out, input)]

    ReduceOps.elementwise_generic_reduce = element_reduce
    ScanOps.elementwise_generic_scan = element_scan
    ReduceOps.generic_reduce = slicewise_reduce
    ScanOps.generic_scan = slicewise_scan


def _helpers_patched_once_per_launch() -> None:
    """Call a kernel's jitted helpers directly once the launch has patched their language modules.

    A launch patches ``triton.language`` (``_patch_lang``) for the kernel; the interpreter then
    patches it again on every call of a jitted helper inside the kernel, scanning the modules'
    members (``inspect.getmembers``) each time: ~20% of the unfolding kernel's test, whose
    programs call ``_unfold_list`` four times each. Patching a module twice changes nothing (a
    patched builtin is no longer a builtin, the rest is set to the same functions), so a helper
    whose modules (``tl`` / ``tl.core`` among its globals) this launch has patched already is
    called as the interpreter would call it after patching; a helper that sees another one
    (the standard library's ``core``) is patched the first time as before.
    """
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    if getattr(interpreter.InterpretedFunction, "patching_call", None) is not None:
        return
    grid_call = interpreter.GridExecutor.__call__
    helper_call = interpreter.InterpretedFunction.__call__
    patched: list[set] = []  # the modules patched by each launch in progress, innermost last
    seen: dict = {}

    def langs(fn) -> frozenset:
        if fn not in seen:
            seen[fn] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        return seen[fn]

    def launch(self, *args, **kwargs):
        patched.append(set(langs(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        mine = langs(self.fn)
        if patched and mine and mine <= patched[-1]:
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # as the interpreter's own helper call reports it
                raise interpreter.InterpreterError(repr(e)) from e
        if patched:
            patched[-1] |= mine
        return helper_call(self, *args, **kwargs)

    interpreter.InterpretedFunction.patching_call = helper_call
    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = call


if os.environ.get("TRITON_INTERPRET") == "1":
    _strict_interpreted_launches()
    _slicewise_interpreted_reductions()
    _helpers_patched_once_per_launch()


@pytest.fixture
def set_options():
    """``set_options(**changes)``: knng's options (``knng.options``) for the rest of the test;
    returns the options in force. Each call nests inside the ones before it."""
    import knng

    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(knng.options(**changes))


#: The engine's tests (``tests/engine/``) run with every row unfolded (marker ``unfolded``).
ENGINE_TESTS = Path(__file__).parent / "engine"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(ENGINE_TESTS):
            item.add_marker(pytest.mark.unfolded)


@pytest.fixture(autouse=True)
def _folding_as_users_run_it(request: pytest.FixtureRequest):
    """Every test runs the defaults users run (graphs fold exact duplicate rows into one,
    ``Options.fold_duplicates``) but those marked ``unfolded``: the engine's tests and the
    screen's arithmetic, whose duplicate-heavy data (integer ties, flat patches, all-equal rows)
    are there to exercise the engine's own tie handling, which folding would route them around.
    ``folds`` (``tests/engine/test_duplicates.py``) keeps folding on among them."""
    if request.node.get_closest_marker("unfolded") is None or request.node.get_closest_marker("folds") is not None:
        yield
        return
    import knng

    with knng.options(fold_duplicates=False):
        yield


@pytest.fixture(autouse=True)
def _block_pipeline_in_engine_tests(request: pytest.FixtureRequest):
    """The engine's tests (marker ``unfolded``) run their small data through the block pipeline,
    whose paths they are there to reach (``Options.direct_max_scores`` and ``direct_max_scores_gpu`` 0); those marked
    ``direct`` (``tests/engine/test_direct.py``) keep the direct path of small calls, which every
    other test runs as users do."""
    if request.node.get_closest_marker("unfolded") is None or request.node.get_closest_marker("direct") is not None:
        yield
        return
    import knng

    with knng.options(direct_max_scores=0, direct_max_scores_gpu=0):
        yield


@pytest.fixture(autouse=True)
def _kernels_compiled_before_they_run(request: pytest.FixtureRequest):
    """GPU tests run with ``Options.background_compile`` off: a first call of a kind on a GPU would
    otherwise run without compiled kernels or with them depending on whether a background
    compilation had finished, and the GPU tests are there to check what the kernels compute.
    The background compilation has its own tests (``tests/engine/test_compiling.py``, and a fresh
    process in ``tests/engine/test_gpu.py``); the paths without kernels on a GPU are checked
    with ``compiled_kernels=False`` there. (On a CPU nothing compiles: the defaults stay.)"""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    import knng

    with knng.options(background_compile=False):
        yield


def _new_seed() -> int:
    env = os.environ.get("KNNG_TEST_SEED")
    if env:
        return int(env)
    return int(np.random.SeedSequence().entropy % 2**63)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    value = _new_seed()
    request.node.user_properties.append(("knng_seed", value))
    print(f"knng seed: {value} (reproduce with KNNG_TEST_SEED={value})")
    return value


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ARG001
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for key, value in item.user_properties:
            if key == "knng_seed":
                report.sections.append(("knng seed", f"KNNG_TEST_SEED={value}"))


@pytest.fixture
def as_kind(tmp_path: Path):
    """Factory ``as_kind(values, kind, dtype, name)`` → the input object of that kind.

    ``values`` is a NumPy array (float64 for bfloat16). Datasets opened here are closed at
    teardown.
    """
    import h5py
    import torch

    files: list = []
    counter = [0]

    def make(values: np.ndarray, kind: str, dtype: str, name: str = "x"):
        counter[0] += 1
        tag = f"{name}{counter[0]}"
        if kind in ("torch", "torch_view"):
            base = np.asarray(values)
            if kind == "torch_view":
                base = np.repeat(base, 2, axis=1)  # columns 0, 2, 4, … are the values
            t = torch.from_numpy(np.ascontiguousarray(base))
            t = t.to(getattr(torch, dtype))
            if kind == "torch_view":
                t = t[:, ::2]
                assert not t.is_contiguous()
            return t
        arr = np.ascontiguousarray(values, dtype=dtype)
        if kind == "numpy":
            return arr
        if kind == "numpy_view":
            wide = np.zeros((arr.shape[0], 2 * arr.shape[1]), dtype=arr.dtype)
            wide[:, 1::2] = arr
            view = wide[:, 1::2]
            assert not view.flags.c_contiguous
            return view
        if kind == "memmap":
            path = tmp_path / f"{tag}.npy"
            np.save(path, arr)
            return np.load(path, mmap_mode="r")
        if kind == "h5py":
            f = h5py.File(tmp_path / f"{tag}.h5", "w")
            f.create_dataset("x", data=arr)
            f.close()
            f = h5py.File(tmp_path / f"{tag}.h5", "r")
            files.append(f)
            return f["x"]
        raise ValueError(kind)

    yield make
    for f in files:
        f.close()


@pytest.fixture(params=["float32", "float64", "int8x4"])
def screen(request: pytest.FixtureRequest, set_options):
    """Force the engine's screen precision (it picks float64 on a CPU when 8·k·d ≥ n).

    Every screen must give the exact answer; after a float32 screen every needed candidate is
    evaluated exactly, after a float64 one most distances are taken from the screen; the digit
    screen (int8x4, the reference of an int8 tensor-core kernel) has the loosest bound.
    Tests check ``last_report().screen_dtype`` to see the choice was applied.
    """
    from knng.api import _LAST_REPORT, last_report

    set_options(screen_precision=request.param)
    _LAST_REPORT["report"] = None
    yield request.param
    report = last_report()
    assert report is not None and report.screen_dtype == request.param, (
        f"the engine did not screen in {request.param}: {report}")


@pytest.fixture(params=[
    pytest.param("cpu", id="interpreted"),
    pytest.param("cuda", id="gpu", marks=[pytest.mark.gpu]),
])
def kernel_device(request, set_options):
    """Where a Triton kernel of the engine runs in a test: Triton's interpreter on CPU tensors
    (``knng.options(kernels={"triton": True})``), or a GPU (``-m gpu``)."""
    import torch


    pytest.importorskip("triton", reason="the kernels run in Triton's interpreter off a GPU")
    if request.param == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton's interpreter is chosen at start only without a GPU")
        set_options(kernels={"triton": True})
    elif not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    return torch.device(request.param)


@pytest.fixture
def spy(monkeypatch):
    """``spy(owner, name)``: wrap ``owner.name`` so that every call is counted in the list it
    returns (and still runs)."""
    def watch(owner, name: str) -> list:
        calls: list = []
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(1) or real(*a, **k))
        return calls

    return watch


@pytest.fixture
def oom_once(monkeypatch):
    """``oom_once(message=None)``: the first seeding of a search's thresholds (its sample block,
    ``knng.engine.search.knn.seed_candidates``) raises a CUDA out-of-memory error once (or a
    ``RuntimeError(message)``); returns ``{"n": calls so far}``."""
    import torch

    import knng.engine.search.knn as search

    def arm(message: str | None = None) -> dict:
        real = search.seed_candidates
        calls = {"n": 0}

        def seed_candidates(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 1:
                raise (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB") if message is None
                       else RuntimeError(message))
            return real(*args, **kwargs)

        monkeypatch.setattr(search, "seed_candidates", seed_candidates)
        return calls

    return arm


@pytest.fixture
def interrupt_after_saves(monkeypatch):
    """``interrupt_after_saves(n)``: the n-th checkpoint save (``Checkpoint.save``) raises
    ``RuntimeError("interrupted")`` right after it is written, as a crash would leave it; returns
    the list of saved steps, which the saves so far fill. ``.undo()`` on the fixture's value
    restores the real save (for the resumed run)."""
    from knng.engine.checkpoint import Checkpoint

    real = Checkpoint.save

    def arm(count: int) -> list:
        saves: list = []

        def save_then_fail(self, state, *args, **kwargs):
            real(self, state, *args, **kwargs)
            saves.append(state.get("step"))
            if len(saves) == count:
                raise RuntimeError("interrupted")

        monkeypatch.setattr(Checkpoint, "save", save_then_fail)
        return saves

    arm.undo = lambda: monkeypatch.setattr(Checkpoint, "save", real)  # type: ignore[attr-defined]
    return arm
