"""Where a run keeps its work beside an output folder, for the checkpoint tests (one process and
distributed): the work area, the step it last saved, and every sibling it leaves."""

from __future__ import annotations

import json
from pathlib import Path


def work_area(out: Path) -> Path:
    """The work area of output folder ``out`` (``.OUT.knng-work`` beside it)."""
    return out.with_name(f".{out.name}.knng-work")


def saved_step(out: Path) -> int | None:
    """The step the work area's ``state.json`` records (a distributed run: the last step every
    rank has saved), or None if there is none yet."""
    try:
        return json.loads((work_area(out) / "state.json").read_text())["step"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def steps_saved(out: Path) -> int:
    """Every step the work area records: its own state's, or, for a distributed graph (whose
    ranks save in their own folders, ``rank-R-of-N``), the sum of the ranks' steps."""
    total = saved_step(out) or 0
    area = work_area(out)
    for sub in sorted(area.glob("rank-*-of-*")) if area.is_dir() else ():
        try:
            total += int(json.loads((sub / "state.json").read_text())["step"])
        except (FileNotFoundError, ValueError, KeyError):
            pass
    return total


def ranks_saved_steps(out: Path, world: int) -> list[int | None]:
    """The step each rank of a distributed graph has saved in its own folder of the work area
    (None where it has saved none yet): the ranks' steps are their own."""
    steps: list[int | None] = []
    for r in range(world):
        try:
            steps.append(json.loads((work_area(out) / f"rank-{r}-of-{world}" / "state.json").read_text())["step"])
        except (FileNotFoundError, ValueError, KeyError):
            steps.append(None)
    return steps


def siblings(out: Path) -> list[str]:
    """Hidden entries beside ``out`` that belong to it (work area, lock, temporaries)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def run_knng(*argv: str, env: dict[str, str] | None = None, wait: bool = True, device: str | None = "cpu",
             computing: bool = True, **popen: object):
    """``python -m knng ARGV`` from this checkout's sources, with ``--no-progress --device DEVICE``
    for a ``computing`` command (search, graph, embed): the finished process (``wait``), or the
    running one, its output captured as text."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    full_env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    extra = ["--no-progress", *(["--device", device] if device else [])] if computing else []
    cmd = [sys.executable, "-m", "knng", *argv, *extra]
    if not wait:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **popen)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=600, **popen)


def processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text`` (a run's unique output path):
    what a stopped job must not leave behind."""
    import os

    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(pid))
    return found
