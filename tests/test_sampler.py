"""MG2's sampler schedule is diffusers' shifted flow-matching table, indexed as MG2 indexes it."""

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from worldtrace_cli.model.sampler import FlowMatchSchedule


def test_table_equals_diffusers_flow_match_schedule():
    reference = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0)
    sigmas, timesteps = FlowMatchSchedule(shift=5.0).table()
    assert torch.allclose(sigmas, reference.sigmas[:1000].float(), atol=1e-6)
    assert torch.allclose(timesteps, reference.timesteps.float(), atol=1e-3)


def test_warped_timesteps_of_the_three_and_four_step_schedules():
    three = FlowMatchSchedule((1000, 666, 333)).timesteps()
    assert torch.allclose(three, torch.tensor([1000.0, 908.8427, 713.9794]), atol=1e-3)
    four = FlowMatchSchedule((1000, 750, 500, 250)).timesteps()
    sigmas, table = FlowMatchSchedule().table()
    assert torch.equal(four, torch.cat([table, torch.zeros(1)])[[0, 250, 500, 750]])
