"""The float16 screen kernels' rate on one square block: mma.sync (``cuda/screen.cu``) against wgmma
(``cuda/screen_wg.cu``), non-symmetric and symmetric, at thresholds that keep about 0, 15 and 100
pairs per row.

One block of n × n rows (default 28,672: a part of a 200k-point graph), K = 128 (``--dims K``), float16 rows
drawn from N(0, 1), factors −2 and 1 and the squared norms as terms, so that the keys are the
squared distances; the thresholds are the distance quantiles that keep the asked number per row.
CUDA-event median of 15 launches after one. TFLOP/s count 2·n²·K. Usage (GPU machine)::

    PYTHONPATH=src python bench/screen_kernel_rates.py [N] [--dims K] [--once VARIANT]

Variants whose shared memory does not fit a block at K (four B tiles of the wgmma ring past
K = 128) are left out; the two-tile ring ("b2") is the one K = 256 runs.

``--nomark``: the wgmma kernel's pre-test without its candidate marks (the ``mark_candidates`` option).
``--only TEXT`` times the variants whose names contain TEXT (e.g. "own block": the triangles
against the rows screens they replace). ``--once VARIANT`` launches one variant once (for ``ncu -k regex:screen``), at thresholds that keep
nothing or, with ``--keep K``, about K pairs per row. ``--against FILE[,FILE]``
also times each wgmma variant compiled from each FILE (other versions of ``cuda/screen_wg.cu``,
their headers beside them), launches of the versions alternating, so that a kernel change is
measured on one machine in one process: each line then gives every version's (this tree's first). Figures:
``docs/BENCHMARKS.md``, "A wgmma screen kernel".
"""
import statistics
import sys

import torch

import knng
from knng.engine import cuda_screen

DEV = torch.device("cuda")
K = 128
#: name: (symmetric, configuration); the triangles screen the upper triangle of A·Aᵀ (a graph
#: part's own block; TFLOP/s still count the whole block's 2·n²·K), against "wgmma" on A·Aᵀ, the
#: rows screen of the whole block they replace.
TRIANGLES = {"wgmma own block, rows": "wg128x128", "wgmma own block, triangle": "wg128x128",
             "wgmma one set own block, triangle": "wg128x128s1",
             "wgmma b2 own block, rows": "wg128x128b2", "wgmma b2 own block, triangle": "wg128x128b2"}
VARIANTS = {
    "mma.sync": (False, "r128x128"),
    "mma.sync, no pre-test": (False, "r128x128np"),
    "wgmma": (False, "wg128x128"),
    "wgmma, no pre-test": (False, "wg128x128np"),
    "mma.sync symmetric 256": (True, "r256x128"),
    "mma.sync symmetric 128": (True, "r128x128"),
    "wgmma symmetric": (True, "wg128x128"),
    # one accumulator set, two blocks a multiprocessor (the configuration K <= 128 runs)
    "wgmma one set": (False, "wg128x128s1"),
    "wgmma one set symmetric": (True, "wg128x128s1"),
    "wgmma b2": (False, "wg128x128b2"),
    "wgmma b2 symmetric": (True, "wg128x128b2"),
    **{name: ("triangle" in name, config) for name, config in TRIANGLES.items()},
}


def main() -> None:
    global K
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 28672
    K = int(sys.argv[sys.argv.index("--dims") + 1]) if "--dims" in sys.argv else K
    once = sys.argv[sys.argv.index("--once") + 1] if "--once" in sys.argv else None
    once_keep = int(sys.argv[sys.argv.index("--keep") + 1]) if "--keep" in sys.argv else 0
    against = sys.argv[sys.argv.index("--against") + 1].split(",") if "--against" in sys.argv else []
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    if "--nomark" in sys.argv:  # the pre-test's slow path tests a half-tile's entries again
        knng.options(mark_candidates=False).__enter__()  # for the rest of the process
    ours = cuda_screen._SOURCE_WG
    g = torch.Generator(device=DEV).manual_seed(0)
    a = torch.randn((n, K), device=DEV, generator=g).half()
    b = torch.randn((n, K), device=DEV, generator=g).half()
    row_factor = torch.full((n,), -2.0, device=DEV)
    col_scale = torch.ones(n, device=DEV)
    row_terms = (a.float() ** 2).sum(1).contiguous()
    col_terms = (b.float() ** 2).sum(1).contiguous()
    capacity = 1 << 23
    lists = [tuple(torch.empty(capacity, dtype=t, device=DEV) for t in (torch.int32, torch.int32, torch.float32))
             for _ in range(2)]
    counters = torch.zeros(2, dtype=torch.int32, device=DEV)
    normal = torch.distributions.Normal(0.0, 1.0)
    for keep in ([once_keep] if once else [0, 15, 100]):
        # squared distances of N(0, 1) rows: about 2K ± sqrt(8K)
        q = -1e30 if keep == 0 else 2 * K + float(normal.icdf(torch.tensor(keep / n))) * (8 * K) ** 0.5
        thr = torch.full((n,), q, device=DEV)
        for name, (symmetric, config) in VARIANTS.items():
            if (once and name != once) or only not in name:
                continue
            cfg = cuda_screen.CONFIGS[config]
            if cfg.wgmma and cuda_screen.shared_bytes(K, cfg, True, True, True) > cuda_screen._ONE_BLOCK:
                continue

            own = name in TRIANGLES

            def launch(source: str = ours) -> None:
                counters.zero_()
                cuda_screen._SOURCE_WG = source
                cols, col_t = (a, row_terms) if own else (b, col_terms)
                cuda_screen.launch_screen(a, cols, K, row_factor, col_scale, row_terms, col_t, thr,
                                          thr if symmetric else None, 0 if own else None, lists, counters,
                                          capacity, config=config, triangle=own and symmetric)

            sources = [ours] + (against if cuda_screen.CONFIGS[config].wgmma else [])
            for source in sources:
                launch(source)
            torch.cuda.synchronize()
            if once:
                continue
            times: dict[str, list[float]] = {source: [] for source in sources}
            for _ in range(15):
                for source in sources:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    launch(source)
                    e1.record()
                    e1.synchronize()
                    times[source].append(e0.elapsed_time(e1))
            kept = counters.tolist()
            rates = "  ".join(f"{statistics.median(t):7.3f} ms {2 * n * n * K / statistics.median(t) / 1e9:6.1f} "
                              f"TFLOP/s" for t in times.values())
            print(f"keep ~{keep:3d}  {name:24s} {rates}  kept per row {kept[0] / n:.1f} / {kept[1] / n:.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
