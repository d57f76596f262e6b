"""LingBot causal-fast schedule (spec §8): integer timesteps and the two sigma look-ups, against the
values the official scheduler produced for the fixtures and against closed forms."""

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from worldtrace_cli.model.lingbot.sampler import CausalFastSchedule, add_noise, flow_to_x0

DATA = Path(__file__).parent / "data" / "lingbot" / "tiny_data.safetensors"


def test_schedule_matches_official_lookups():
    ref = load_file(str(DATA))
    s = CausalFastSchedule()
    assert s.timesteps().tolist() == [999, 967, 908, 768] == ref["denoising_timesteps"].tolist()
    assert s.x0_rows() == [0, 248, 500, 750] == ref["x0_sigma_index"].tolist()
    assert s.add_noise_rows() == [249, 501, 751] == ref["add_noise_sigma_index"].tolist()
    assert torch.equal(s.x0_sigmas(), ref["x0_sigmas"])
    assert torch.equal(s.add_noise_sigmas(), ref["add_noise_sigmas"])


def test_table_closed_form_and_truncation():
    ts, sig = CausalFastSchedule(shift=10.0).table()
    assert ts.dtype == np.int64 and ts.shape == (1000,) and sig.shape == (1001,) and sig[-1] == 0
    assert np.all(np.diff(ts) <= 0) and ts[0] == 999 and ts[-1] == 9  # last row: s = 0.000999, sigma ~ 0.0099
    s0 = float(np.float32(0.999))
    assert abs(sig[0] - 10 * s0 / (1 + 9 * s0)) < 1e-7
    # rows 248 and 249 share timestep 967: x0 takes the first, add_noise the second
    assert ts[248] == ts[249] == 967 and ts[247] != 967
    # shift 1 with evenly spaced rows: timesteps are plain truncations of 1000 * s
    assert CausalFastSchedule(shift=1.0, indices=(0, 500)).timesteps().tolist() == [999, 499]


def test_x0_and_add_noise_are_the_flow_matching_identities():
    gen = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(16, 4, 4, 8, generator=gen), torch.randn(16, 4, 4, 8, generator=gen)
    sigma = 0.9
    xt = add_noise(x0, eps, sigma)
    assert xt.dtype == torch.float32
    assert torch.allclose(flow_to_x0(xt, eps - x0, sigma), x0, atol=1e-6)
