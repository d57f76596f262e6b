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


def test_euler_steps_are_diffusers_flow_match_euler_steps():
    """The ``euler`` sampler moves x with the model's own predicted noise: step for step the same as
    diffusers' FlowMatchEulerDiscreteScheduler.step on the same sigmas (shift applied by ours, 1 there)."""
    import pytest

    from worldtrace_cli.model.sampler import flow_to_x0, next_x

    schedule = FlowMatchSchedule((1000, 750, 500, 250), 2.0, "euler")
    sigmas = schedule.sigmas()
    reference = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    reference.set_timesteps(sigmas=sigmas.tolist())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 3, 2, 4, generator=gen)
    x_ref = x.clone()

    def never():
        raise AssertionError("euler draws no noise after the first")

    for s in range(len(sigmas) - 1):
        flow = torch.randn(x.shape, generator=gen)
        x = next_x(flow_to_x0(x, flow, sigmas[s]), flow, sigmas[s + 1], "euler", never)
        x_ref = reference.step(flow, reference.timesteps[s], x_ref).prev_sample
        assert torch.allclose(x, x_ref, atol=1e-5)
    # renoise: x0 re-noised with the draw it is given
    noise = torch.randn(x.shape, generator=gen)
    x0 = flow_to_x0(x, flow, sigmas[-1])
    assert torch.allclose(next_x(x0, flow, 0.5, "renoise", lambda: noise), 0.5 * x0 + 0.5 * noise)
    with pytest.raises(ValueError, match="unknown sampler 'ddim'"):
        next_x(x0, flow, 0.5, "ddim", lambda: noise)
