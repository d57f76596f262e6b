"""A session of a text-to-video preset (Self-Forcing / LongLive): each :meth:`~worldtrace_cli.session.Session.step`
takes the chunk's prompt instead of actions (``step(prompt="a red lighthouse")``; without one the
previous prompt goes on), logged as one-chunk prompt segments, so ``trajectory.yaml`` is a prompt
trajectory that ``worldtrace generate`` replays. A prompt switch re-caches as ``generate`` does
(``--prompt-switch``, the session's ``prompt_switch``)."""

from __future__ import annotations

from ..errors import InputError


def text_chunk(log, actions, prompt) -> tuple[str, list[dict], list[tuple]]:
    """One text chunk's log entry (as :func:`~.actions.parse_chunk_actions` for actions): display name,
    segments ``[{"prompt": p, "chunks": 1}]``, per-row ``((), None)`` for the chunk's pixel frames.
    ``prompt`` (or a non-``idle`` ``actions`` string: ``step("a lighthouse")``) sets the prompt; none
    repeats the last chunk's.

    Raises:
        InputError: no prompt yet, an empty or over-long prompt, or actions other than a prompt.
    """
    from ..trajectory.prompts import check_prompt, prompt_label

    if prompt is None and actions != "idle":
        if not isinstance(actions, str):
            raise InputError("step: a text-to-video session takes a prompt (step(prompt='...')), not actions")
        prompt = actions
    if prompt is None:
        if not log.plan.prompts:
            raise InputError("step: the first chunk of a text-to-video session needs a prompt: step(prompt='...')")
        prompt = log.plan.prompts[-1]
    if not isinstance(prompt, str):
        raise InputError(f"step: prompt must be text, got {type(prompt).__name__}")
    try:
        prompt = check_prompt(prompt, "step: prompt")
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return prompt_label(prompt), [{"prompt": prompt, "chunks": 1}], [((), None)] * log.rows_next()


__all__ = ["text_chunk"]
