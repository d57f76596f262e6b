"""``generate --nproc-per-node N --fsdp|--split-heads``: the sharded run's N processes on this machine,
launched through PyTorch's own elastic launcher (``torch.distributed.launcher.api.elastic_launch``, what
``torchrun`` runs), with the outcome a batch script can trust: the documented exit codes (README) and
one line per refusal, instead of torchrun's exit 1 and its traceback.

The launching process checks the inputs once (before torch loads), then starts N copies of the same
``worldtrace generate`` command (without ``--nproc-per-node``) under torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT through a c10d rendezvous on localhost). Process 0 reports
the run (stdout: the folder) and its own errors; the others stay quiet and leave a failure's one line
in a file of the launch's error folder (:func:`note_failure`), so the launcher can name a failure that
happened in another process only. Outcome:

- every process exited 0: exit 0;
- process 0 exited with a code (2 input, 4 output, 5 run, 6 busy, 7 inconsistent, 130 stopped, 131
  aborted): that code (its line already on stderr);
- process 0 was ended by the launcher because another failed: that process's line and code, or exit
  1 ("a bug") with its exit status when it left none (a crash).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

log = logging.getLogger("worldtrace")

ERRORS_ENV = "WORLDTRACE_SHARD_ERRORS"  # the folder where a process other than 0 leaves its failure's line


def torchrun_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (RANK, WORLD_SIZE); (0, 1) outside torchrun or
    with values that are not integers (the sharded run's own check names them)."""
    try:
        return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return 0, 1


def note_failure(message: str, code: int) -> None:
    """In a process of a launched run: leave its exit ``code`` and ``message`` (one line; process 0's is
    on stderr already) where the launcher reads them (:data:`ERRORS_ENV`); nothing outside a launch or
    when the process noted one already."""
    folder = os.environ.get(ERRORS_ENV)
    rank, _ = torchrun_world()
    if not folder or (Path(folder) / f"rank-{rank}.txt").exists():
        return
    try:
        (Path(folder) / f"rank-{rank}.txt").write_text(f"{code}\n{' '.join(str(message).split())[:500]}\n")
    except OSError:
        pass


PROCESS_0_WAIT_S = 30.0  # how long a process other than 0 holds back a refusal process 0 also meets (seconds)


def wait_for_process_0(seconds: float = PROCESS_0_WAIT_S) -> None:
    """In a process of a torchrun launch (``TORCHELASTIC_RUN_ID`` set) other than 0 that refuses what process 0
    refuses too (the inputs, the folder, a command that does not split): wait up to ``seconds`` so that process 0
    exits first with its one line and torchrun ends this one; exiting first let torchrun end process 0 before it
    printed (a loaded machine: CI, 2026-12-02). A refusal of this process alone surfaces after the wait. Returns
    at once outside torchrun or in process 0."""
    import time

    rank, world = torchrun_world()
    if not rank or world < 2 or not os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    time.sleep(seconds)


def _noted(folder: Path, rank: int) -> tuple[int, str] | None:
    try:
        code, message = (folder / f"rank-{rank}.txt").read_text().split("\n", 1)
        return int(code), message.strip()
    except (OSError, ValueError):
        return None


def launch(args: list[str], nproc: int) -> int:
    """Run ``worldtrace generate ARGS`` (``args``: the command line after ``generate``, without
    ``--nproc-per-node``) in ``nproc`` processes on this machine; returns the exit code to leave with
    (the module docstring). Ctrl-C reaches every process (the terminal's process group): process 0
    stops after its chunk and saves the run, as under torchrun.

    Raises:
        nothing: a launcher failure (the rendezvous) is one line on stderr and exit 1.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.root.manager.loggerDict):  # the launcher's own lines repeat ours ("failed (exitcode: 2)")
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.launcher"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"worldtrace-{uuid.uuid4().hex[:12]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    with tempfile.TemporaryDirectory(prefix="worldtrace-launch-") as scratch:
        os.environ[ERRORS_ENV] = scratch
        try:
            elastic_launch(config, sys.executable)("-m", "worldtrace_cli", "generate", *args)
            return 0
        except ChildFailedError as exc:
            return _outcome({rank: failure.exitcode for rank, failure in exc.failures.items()}, Path(scratch), nproc)
        except SignalException as exc:  # Ctrl-C / SIGTERM: the launcher handed it to the processes and waited
            noted = _noted(Path(scratch), 0)
            return noted[0] if noted is not None else 128 + int(exc.sigval)
        except Exception as exc:  # the launcher itself (rendezvous, a port): not the run
            sys.stderr.write(f"worldtrace: error: --nproc-per-node {nproc}: the launcher failed "
                             f"({' '.join(str(exc).split())[:300]})\n")
            return 1
        finally:
            os.environ.pop(ERRORS_ENV, None)


def _outcome(codes: dict[int, int], scratch: Path, nproc: int) -> int:
    """The launch's exit code from the processes' exit statuses (``codes``: rank -> status, negative for a
    signal) and the lines they left (see the module docstring)."""
    own = codes.get(0)
    noted = _noted(scratch, 0)
    if own is not None and own > 0:
        return own  # process 0 said why (its line is on stderr)
    if noted is not None and noted[0] > 0:
        return noted[0]  # process 0 ended with its code before the launcher ended the others
    for rank in sorted(r for r in codes if r):
        noted = _noted(scratch, rank)
        if noted is not None:
            code, message = noted
            sys.stderr.write(f"worldtrace: error: process {rank} of {nproc}: {message}\n")
            return code
    rank = min(r for r in codes if codes[r] != 0) if any(codes.values()) else min(codes)
    status = codes[rank]
    if status < 0:
        sys.stderr.write(f"worldtrace: error: process {rank} of {nproc} was killed by signal {-status}; every "
                         f"finished chunk is in the run folder\n")
    else:
        sys.stderr.write(f"worldtrace: error: process {rank} of {nproc} exited with status {status} without saying "
                         f"why; this is a bug (run it again with -v for the traceback)\n")
    return 1


__all__ = ["ERRORS_ENV", "PROCESS_0_WAIT_S", "launch", "note_failure", "torchrun_world", "wait_for_process_0"]
