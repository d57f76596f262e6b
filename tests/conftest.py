"""Shared fixtures: the tiny random DiT of the golden-fixture configuration, and one intra-op thread."""

import json
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "data" / "fixtures"


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
