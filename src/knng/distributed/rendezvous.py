"""Where a rank finds its job: torchrun's variables, knng's launcher's, or Slurm's.

``torch.distributed``'s ``env://`` rendezvous reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (``LOCAL_RANK`` picks the GPU). ``torchrun`` and ``knng ... --gpus N`` set them;
Slurm's ``srun`` sets its own instead, and :func:`torch_environment` translates them:

========================  ====================================================================
torch.distributed         from Slurm (a variable already set wins)
========================  ====================================================================
``RANK``                  ``SLURM_PROCID``
``WORLD_SIZE``            ``SLURM_STEP_NUM_TASKS`` (the tasks of the ``srun`` step)
``LOCAL_RANK``            ``SLURM_LOCALID``
``LOCAL_WORLD_SIZE``      the first number of ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE``
``MASTER_ADDR``           the first host of ``SLURM_STEP_NODELIST``, ``SLURM_JOB_NODELIST`` or
                          ``SLURM_NODELIST`` (a hostlist such as ``gpu[03-06,09]`` → ``gpu03``)
``MASTER_PORT``           :func:`slurm_port` of ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``: the same on
                          every task of the step, different for the next job, in 15000–31999
                          (below Linux's ephemeral ports)
========================  ====================================================================

Only a task of an ``srun`` step of several tasks is a rank: ``SLURM_PROCID`` and ``SLURM_NTASKS``
are also set in a batch script (which runs once, whatever ``--ntasks`` says), and an interactive
``srun --pty bash`` is a step of one task; in both knng runs as one process.

This module imports nothing but the standard library: the command line asks it whether it is a
rank before it has imported torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = ["is_launched", "job_rank", "local_rank", "torch_environment", "apply_environment", "first_host",
           "slurm_port", "SLURM_PORT_BASE", "SLURM_PORT_SPAN"]

#: :func:`slurm_port`'s range: [SLURM_PORT_BASE, SLURM_PORT_BASE + SLURM_PORT_SPAN).
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 17000
#: Steps of one job that may rendezvous at once on distinct ports.
_STEPS_PER_JOB = 4

_BRACKET = re.compile(r"\[([^\]]*)\]")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``"gpu[03-06,09],cpu1"`` → ``"gpu03"``,
    ``"rack[1-2]-n[01-04]"`` → ``"rack1-n01"``, ``"node7"`` → ``"node7"``.

    Raises
    ------
    ValueError
        If ``nodelist`` is empty or its brackets do not close; the message names it.
    """
    text = nodelist.strip()
    # The first top-level comma ends the first entry (commas inside brackets list ranges).
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            end = i
            break
    entry = text[:end]
    if not entry or entry.count("[") != entry.count("]"):
        raise ValueError(f"SLURM nodelist {nodelist!r} is not a hostlist such as node[01-04]")
    # Each bracket contributes its first range's first number, zero padding kept.
    return _BRACKET.sub(lambda m: m.group(1).split(",")[0].split("-")[0], entry)


def slurm_port(job_id: int, step_id: int = 0) -> int:
    """The rendezvous port of a Slurm step: the same on every task, another for the next job."""
    return SLURM_PORT_BASE + (job_id * _STEPS_PER_JOB + step_id % _STEPS_PER_JOB) % SLURM_PORT_SPAN


def _slurm_tasks(environ: Mapping[str, str]) -> int:
    """The tasks of this process's ``srun`` step (1 outside one)."""
    text = environ.get("SLURM_STEP_NUM_TASKS", "1")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"SLURM_STEP_NUM_TASKS={text!r} must be an integer") from None


def _is_slurm_job(environ: Mapping[str, str]) -> bool:
    """A task of an ``srun`` step of several tasks (not a batch script, not a step of one task)."""
    return "SLURM_PROCID" in environ and _slurm_tasks(environ) > 1


def torch_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``env://`` variables this process should use, from torchrun's or Slurm's.

    Parameters
    ----------
    environ : mapping, optional
        The environment (default: ``os.environ``).

    Returns
    -------
    dict
        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
        ``MASTER_PORT`` as far as they are known: those set win, Slurm's fill the others (see
        the table above); empty outside a job.

    Raises
    ------
    ValueError
        If a Slurm variable is malformed; the message names it.
    """
    env = os.environ if environ is None else environ
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    out = {key: env[key] for key in keys if key in env}
    if "RANK" in env or not _is_slurm_job(env):
        return out
    slurm = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(_slurm_tasks(env)),
             "LOCAL_RANK": env.get("SLURM_LOCALID", "0")}
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE"))
    if per_node:  # "4(x2),3": the first node's count
        slurm["LOCAL_WORLD_SIZE"] = re.split(r"[(,]", per_node)[0]
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        slurm["MASTER_ADDR"] = first_host(nodelist)
    if "SLURM_JOB_ID" in env:
        try:
            job, step = int(env["SLURM_JOB_ID"]), int(env.get("SLURM_STEP_ID", "0"))
        except ValueError:
            raise ValueError(f"SLURM_JOB_ID={env['SLURM_JOB_ID']!r} and SLURM_STEP_ID="
                             f"{env.get('SLURM_STEP_ID')!r} must be integers (set MASTER_PORT to bypass)") from None
        slurm["MASTER_PORT"] = str(slurm_port(job, step))
    return {**slurm, **out}


def apply_environment() -> None:
    """Set the ``env://`` variables that :func:`torch_environment` derives and are not set yet."""
    for key, value in torch_environment().items():
        os.environ.setdefault(key, value)


def is_launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one rank of a job (torchrun, knng's launcher, a Slurm step of
    several tasks)."""
    env = torch_environment(environ)
    return "RANK" in env and "WORLD_SIZE" in env


def job_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank in its job, or None outside one."""
    env = torch_environment(environ)
    return int(env["RANK"]) if "RANK" in env and "WORLD_SIZE" in env else None


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank on its host (``LOCAL_RANK``, or Slurm's ``SLURM_LOCALID``; else 0)."""
    return int(torch_environment(environ).get("LOCAL_RANK", "0"))
