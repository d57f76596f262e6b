"""``mixed:k``: k WorldTrace-Field slots + (N_s - k) WorldTrace-Landmark slots in one cache
(paper App. "Unified Cache Allocation", Table "Slot allocation": kF + (N_s-k)L).

Both components see every latent frame that leaves the recent window: the field component folds it
into its canonical group means, the landmark component tests it for a scene entry. Slot order,
which is the rank order of slot-rank positions (Def. 1): the k field slots (oldest group first),
then the N_s - k landmark slots (oldest landmark first), then the N_r recent slots. ``mixed:0`` is
``landmark`` and ``mixed:N_s`` is ``field`` with the same budget.
"""

from __future__ import annotations

from ..writer_options import DEFAULT_WINDOW, mixed_field_slots
from .base import MemoryConfig, register
from .field import FieldSummary
from .landmark import LandmarkSummary
from .window import RecentWindowWriter, SummaryMemory


@register(example="mixed:2")
class MixedWriter(RecentWindowWriter):
    """mixed:k: k field slots + (N_s - k) landmark slots + N_r recent slots, slot-rank positions.

    ``k`` is checked against N_s when the writer is built (for the window it is given) and again at
    ``reset``, where N_s follows the model's window.
    """

    name = "mixed"
    default_positions = "slot_rank"

    def __init__(self, config: MemoryConfig, default_budget: int, window: int = DEFAULT_WINDOW):
        super().__init__(config, default_budget, window)
        self.n_field = mixed_field_slots(config, self.n_summary)
        self.n_landmark = self.n_summary - self.n_field

    def make_components(self) -> list[SummaryMemory]:
        self.n_field = mixed_field_slots(self.config, self.n_summary)  # N_s is final now
        self.n_landmark = self.n_summary - self.n_field
        # a zero-slot component would only cost work (the field writer's host copies, say)
        comps: list[SummaryMemory] = []
        if self.n_field:
            comps.append(FieldSummary(self.n_field, self.settings.spill_dir))
        if self.n_landmark:
            comps.append(LandmarkSummary(self.n_landmark, self.config))
        return comps

    def describe(self) -> dict:
        d = super().describe()
        d["mixed"] = {"field_slots": self.n_field, "landmark_slots": self.n_landmark}
        return d
