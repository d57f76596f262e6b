"""``naive``: averaging RoPE-*rotated* keys, the phase-cancelling baseline of paper §2.2.

Same groups, store and incremental sums as ``field`` (:class:`~.field.FieldSummary`), but each
source key is rotated to its absolute latent frame t_i before it is averaged:

    K_naive = (1/n) sum_i R(omega t_i) k_i            (paper §2.2, per temporal RoPE pair)

Keys from distant frames point in different directions on the fast temporal pairs and cancel.
The slot is placed at its group centroid c = mean_i t_i. Our contract stores canonical keys that
the model rotates at the slot's read position, so the slot stores the canonical equivalent
R(-omega c) K_naive: read at c it is exactly K_naive; read elsewhere it moves rigidly with it.
Rotation is linear, so running sums of rotated keys stay valid as group boundaries move. Values
are averaged plainly. All rotation goes through :class:`~worldtrace_cli.model.rope.MainRope`.
"""

from __future__ import annotations

import torch

from ..model.rope import MainRope
from .base import CacheGeometry, register
from .field import FieldSummary, FieldWriter
from .window import SummaryMemory


class NaiveSummary(FieldSummary):
    """N_s slots averaging keys rotated at their absolute latent frames, re-expressed at the centroid.

    Slots have kind ``naive`` (rotated-domain averages, not WorldTrace Field slots) and role
    ``summary``; state and groups are :class:`~.field.FieldSummary`'s.
    """

    kind = "naive"

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._rope = MainRope(geometry.head_dim)

    def _at(self, k: torch.Tensor, position: float) -> torch.Tensor:
        """Rotate every token of ``k`` [B, T, H, D] to one temporal ``position`` (latent frames)."""
        return self._rope.apply_temporal(k, torch.full((k.shape[1],), float(position), dtype=torch.float64))

    def contribution(self, index: int) -> torch.Tensor:
        """float32 [L, 2, T, H, D]: key rotated to R(omega t_i) k_i at its absolute frame, value as is."""
        x = self._fetch(index).float()  # may alias the store: build a new tensor, never write into x
        return torch.stack((self._at(x[:, 0], self._ids[index]), x[:, 1]), dim=1)  # layers = batch axis

    def finish_key(self, k_mean: torch.Tensor, frames: tuple[int, ...]) -> torch.Tensor:
        """R(-omega c) times the mean rotated key, c = the group centroid (float32 [1, T, H, D])."""
        return self._at(k_mean, -sum(frames) / len(frames))

    def describe(self) -> dict:
        d = super().describe()
        d["field"].update(keys="mean of keys rotated at source frames, re-expressed at the centroid")
        return d


@register
class NaiveWriter(FieldWriter):
    """Naive rotated-key averaging (paper §2.2 phase-cancellation baseline): N_r recent + N_s naive slots."""

    name = "naive"
    default_positions = "block_relative"

    def make_components(self) -> list[SummaryMemory]:
        return [NaiveSummary(self.n_summary, self.settings.spill_dir)]
