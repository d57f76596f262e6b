"""Echo's pipeline: MG2's, conditioned on one flat grey frame instead of a start image."""

from __future__ import annotations

from PIL import Image

from worldtrace_cli.engine.base import RunConditioning
from worldtrace_cli.engine.mg2 import MG2Pipeline

GREY = (128, 128, 128)  # the start frame every Echo run is conditioned on (uint8 RGB)


class EchoPipeline(MG2Pipeline):
    """:class:`~worldtrace_cli.engine.mg2.MG2Pipeline` whose :meth:`condition` takes no image."""

    reads = MG2Pipeline.reads - {"image"}  # what its row declares (engine/base.py:check_row)

    def condition(self, request: RunConditioning):
        """Encode a flat grey frame of the preset's size for ``request.num_chunks`` chunks (the row takes
        no start image, so ``request.image`` is always None here)."""
        assert request.image is None, "the registry refuses a start image for Echo before the model loads"
        grey = Image.new("RGB", (self.preset.width, self.preset.height), GREY)
        return super().condition(RunConditioning(request.num_chunks, grey))
