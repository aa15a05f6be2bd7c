"""Kill knng runs at random instants, resume each, and check that nothing is ever lost or wrong.

Not collected by pytest (it runs for minutes): ``python tests/kill_loop.py --kills 60``. The
figures it prints are quoted in docs/RELIABILITY.md.

Four scenarios: ``knng graph`` and ``knng search``, each in one process and with ``--procs 2``,
checkpointing after every step (``--checkpoint-interval 0``). For each, an uninterrupted run
gives the reference; then runs into another folder, always with ``--resume`` (which starts from
the beginning when there is nothing to resume), are stopped at a random instant by SIGKILL,
SIGINT or SIGTERM (to the launching process, as a user or a scheduler would) until one finishes.
After every stop it checks:

- the exit status is the signal's (SIGINT 130, SIGTERM 143, SIGKILL -9) or 0 (the run had
  finished), and no traceback was printed; after SIGINT/SIGTERM exactly one line (a SIGINT or
  SIGTERM in the interpreter's own start-up, before knng's first line, is counted apart: see
  :data:`START_UP_SECONDS`);
- no process of the run is left (ranks end with their launcher);
- the output folder is absent or holds a complete result set, never a part of one;
- after SIGINT/SIGTERM nothing is left beside the folder but a work area with progress (a kill
  -9 may leave staging folders: the next run removes them).

When a run finishes, its results must equal the reference bit for bit, and nothing may be left
beside the folder.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from output_folders import processes_naming, run_knng, siblings, work_area  # noqa: E402

from knng.io import WorkArea  # noqa: E402

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
EXPECTED_STATUS = {"SIGKILL": -signal.SIGKILL, "SIGINT": 130, "SIGTERM": 143}


def scenarios(data: Path, queries: Path) -> dict[str, tuple[str, ...]]:
    graph = ("graph", str(data), "-k", "6", "--checkpoint-interval", "0")
    search = ("search", str(data), str(queries), "-k", "9", "--checkpoint-interval", "0", "--memory-budget", "16MB")
    return {"graph, one process": graph, "graph, --procs 2": (*graph, "--procs", "2"),
            "search, one process": search, "search, --procs 2": (*search, "--procs", "2")}


def results(out: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.load(out / "indices.npy"), np.load(out / "distances.npy")


def one_scenario(name: str, argv: tuple[str, ...], root: Path, kills: int, rand: random.Random) -> dict:
    ref = root / f"ref-{len(list(root.iterdir()))}"
    t0 = time.monotonic()
    done = run_knng(*argv, "-o", str(ref))
    if done.returncode != 0:
        raise SystemExit(f"{name}: the uninterrupted run failed: {done.stderr}")
    seconds = time.monotonic() - t0
    expected = results(ref)
    out = root / f"out-{len(list(root.iterdir()))}"
    record = {"scenario": name, "uninterrupted_s": round(seconds, 2), "stops": {}, "runs_finished": 0,
              "identical": 0, "different": 0, "problems": []}
    stops = 0
    while True:
        last = stops >= kills
        proc = run_knng(*argv, "-o", str(out), "--resume", wait=False)
        if last:
            _, stderr = proc.communicate(timeout=900)
            if proc.returncode != 0:
                record["problems"].append(f"the final run failed: {stderr.strip()[-300:]}")
            break
        delay = rand.uniform(0.0, 0.6 * seconds)  # mostly mid-run; some runs still finish first
        how = rand.choice(list(SIGNALS))
        time.sleep(delay)
        finished_first = proc.poll() is not None
        proc.send_signal(SIGNALS[how])
        _, stderr = proc.communicate(timeout=300)
        stops += 0 if finished_first else 1
        if not finished_first:
            record["stops"][how] = record["stops"].get(how, 0) + 1
        check_stop(record, out, proc.returncode, stderr, how, finished_first, delay)
        if (out / "knng.json").exists():
            compare(record, out, expected)
            for path in out.iterdir():  # start the next round from nothing
                path.unlink()
            out.rmdir()
    compare(record, out, expected)
    left = siblings(out)
    if left:
        record["problems"].append(f"left beside the folder at the end: {left}")
    return record


#: A stop this early may land before the interpreter runs knng's first line (its start-up: the
#: ``site`` module, ``runpy``), where the signal is Python's own business (docs/RELIABILITY.md,
#: "Limits"): such a stop is counted apart, as a kill.
START_UP_SECONDS = 0.2


def in_start_up(status: int, stderr: str, delay: float) -> bool:
    """Whether a stop ended the process before knng's code ran: by the signal itself, silently,
    or in a KeyboardInterrupt traceback that names no knng frame."""
    if delay > START_UP_SECONDS:
        return False
    if status in (-signal.SIGINT, -signal.SIGTERM) and not stderr.strip():
        return True
    return status == 1 and "KeyboardInterrupt" in stderr and "knng" not in stderr.replace("-m knng", "")


def check_stop(record: dict, out: Path, status: int, stderr: str, how: str, finished: bool, delay: float) -> None:
    where = f"{how} at {delay:.2f} s"
    if not finished and how != "SIGKILL" and in_start_up(status, stderr, delay):
        record["start_up"] = record.get("start_up", 0) + 1
        return
    if "Traceback" in stderr:
        record["problems"].append(f"{where}: a traceback: {stderr.strip()[-400:]}")
    if finished or status == 0:
        return
    if status != EXPECTED_STATUS[how]:
        record["problems"].append(f"{where}: exit status {status}: {stderr.strip()[-300:]}")
    if how != "SIGKILL" and stderr.count("\n") != 1:
        record["problems"].append(f"{where}: {stderr.count(chr(10))} lines on stderr: {stderr.strip()[-300:]}")
    time.sleep(0.3)  # ranks killed with their launcher (PR_SET_PDEATHSIG) need a moment to go
    if processes_naming(str(out)):
        record["problems"].append(f"{where}: processes left running")
    if out.exists() and not (out / "knng.json").exists():
        record["problems"].append(f"{where}: a partial output folder: {sorted(p.name for p in out.iterdir())}")
    if how != "SIGKILL":
        stale = [s for s in siblings(out) if s != work_area(out).name]
        area = WorkArea(work_area(out))
        if stale or (area.exists() and not area.has_progress()):
            record["problems"].append(f"{where}: left beside the folder: {siblings(out)}")


def compare(record: dict, out: Path, expected: tuple[np.ndarray, np.ndarray]) -> None:
    if not (out / "knng.json").exists():
        return
    record["runs_finished"] += 1
    idx, dist = results(out)
    same = np.array_equal(idx, expected[0]) and np.array_equal(dist, expected[1])
    record["identical" if same else "different"] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=60, help="stops in all, spread over the four scenarios")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", type=Path, help="also write the records here")
    args = parser.parse_args()
    rand = random.Random(args.seed)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="knng-kill-loop-") as tmp:
        root = Path(tmp)
        centres = rng.standard_normal((30, 12)) * 4
        x = (centres[rng.integers(0, 30, 17000)] + rng.standard_normal((17000, 12))).astype(np.float32)
        x[100:140] = x[7]  # duplicates: ties broken by index
        np.save(root / "x.npy", x)
        np.save(root / "q.npy", rng.standard_normal((9000, 12)).astype(np.float32))
        runs = root / "runs"
        runs.mkdir()
        plan = scenarios(root / "x.npy", root / "q.npy")
        per = -(-args.kills // len(plan))
        t0 = time.monotonic()
        records = [one_scenario(name, argv, runs, per, rand) for name, argv in plan.items()]
    total = sum(sum(r["stops"].values()) for r in records)
    print(f"{total} stops in {time.monotonic() - t0:.0f} s (seed {args.seed})")
    print("| scenario | uninterrupted | stops (SIGKILL / SIGINT / SIGTERM) | in Python's start-up | runs finished | "
          "identical | different | problems |")
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        stops = " / ".join(str(r["stops"].get(s, 0)) for s in SIGNALS)
        print(f"| {r['scenario']} | {r['uninterrupted_s']} s | {stops} | {r.get('start_up', 0)} | {r['runs_finished']} | "
              f"{r['identical']} | {r['different']} | {len(r['problems'])} |")
    for r in records:
        for problem in r["problems"]:
            print(f"{r['scenario']}: {problem}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 0 if all(not r["problems"] and not r["different"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
