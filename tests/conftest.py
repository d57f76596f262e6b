"""Shared fixtures: the tiny random DiT of the golden-fixture configuration, and one intra-op thread."""

import json
import os
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # -n auto runs one worker per core: each worker's torch, and every process a test starts, on one
    # intra-op thread (two OpenMP threads per worker on a 2-core machine spin against each other)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "data" / "fixtures"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n auto``: work stealing (the tests take from milliseconds to 40 s; a worker that runs out
    takes half of a busy one's queue instead of waiting at the end)."""
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


@pytest.fixture(scope="session")
def dit():
    """CausalWanDiT of tests/data/fixtures/tiny_config.json with seeded random weights (seed 3).
    Stateless between rollouts (rollout state lives outside the module), so tests share it."""
    from worldtrace_cli.model.config import DiTConfig
    from worldtrace_cli.model.dit import CausalWanDiT, init_random_weights

    model = CausalWanDiT(DiTConfig.from_dict(json.loads((FIXTURES / "tiny_config.json").read_text()))).eval()
    init_random_weights(model, seed=3)
    return model


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: with 2 OpenMP threads on a busy 2-core machine these tests ran 10-100x slower
    (spinning threads); with 1 thread each takes well under a second."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def check_seeded_random_init(build):
    """``build(seed)`` twice with one seed gives identical weights, another seed different ones; the
    global RNG is untouched; the module is in eval mode without gradients."""
    state = torch.get_rng_state()
    a, b, c = build(1), build(1), build(2)
    assert torch.equal(torch.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert not a.training and not any(p.requires_grad for p in a.parameters())


def assert_valid(obj, name: str):
    """Validate a written JSON object against worldtrace's schema ``name`` (jsonschema, draft 2020-12)."""
    import jsonschema

    from worldtrace_cli.schemas import SCHEMA_VERSION, load_schema

    jsonschema.Draft202012Validator(load_schema(name)).validate(obj)
    assert obj["schema_version"] == SCHEMA_VERSION


@pytest.fixture
def valid():
    """``valid(obj_or_path, name)``: assert a written output (dict, JSON or JSONL file) matches its schema."""
    def check(what, name):
        if isinstance(what, (str, Path)):
            path = Path(what)
            text = path.read_text()
            objs = [json.loads(line) for line in text.splitlines() if line] if path.suffix == ".jsonl" else [json.loads(text)]
        else:
            objs = [what]
        assert objs
        for obj in objs:
            assert_valid(obj, name)
    return check


def skip_without_ffmpeg():
    """Skip a test that writes or reads an MP4 where imageio-ffmpeg finds no ffmpeg executable: the GPU
    machine's image has none, and imageio-ffmpeg's 80 MB binary cannot travel there (the device tool
    carries at most 64 MiB with the tracked tree; benchmarks/gpu/fetch-wheels.sh slims the wheel)."""
    from worldtrace_cli.errors import OutputError
    from worldtrace_cli.outputs.video import ffmpeg_exe

    try:
        ffmpeg_exe()
    except OutputError as err:
        pytest.skip(str(err))


def invoke(*args):
    """``worldtrace ARGS`` through click's CliRunner (in process), every argument as a string."""
    from click.testing import CliRunner

    from worldtrace_cli.cli import main

    return CliRunner().invoke(main, [*map(str, args)])


def one_line_error(result, code=2):
    """The one ``worldtrace: error:`` line of a CliRunner result that exited ``code``, no traceback."""
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("worldtrace: error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


# -- stopping the suite: Ctrl-C (or SIGTERM) ends every process it started within seconds ---------------
# The workers of -n auto and the processes tests start (generate runs in their own sessions, ffmpeg,
# Chromium) do not all see a terminal's Ctrl-C, and xdist waits for its workers to finish their test: a
# stopped suite took over 60 s and left processes behind. The controller kills its whole tree instead.


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children first), read from /proc (Linux; elsewhere none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def kill_descendants(grace: float = 2.0) -> int:
    """SIGTERM every process below this one, then SIGKILL those still alive after ``grace`` seconds.
    Returns how many there were."""
    import signal
    import time

    pids = _descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM and pids:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and not _zombie(p) for p in pids):
                time.sleep(0.05)
    return len(pids)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().decode(errors="replace").rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def pytest_configure(config):
    """The controller (not an xdist worker): SIGTERM stops the suite as Ctrl-C does."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        pass


def pytest_keyboard_interrupt(excinfo):
    """Ctrl-C / SIGTERM in the controller: end the workers and every process the tests started now, so
    the suite stops in seconds instead of waiting for each worker's test."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        kill_descendants()
