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
