"""Labelled contact sheets of video frames (PIL): the stills of ``compare`` and of ``train eval
--pictures``. A leaf module: it imports nothing of worldtrace."""

from __future__ import annotations

import numpy as np


def font(size: int):
    """PIL's default font at ``size`` pixels (a fixed-size bitmap font on Pillow < 10.1)."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def frame_sheet(rows: list[np.ndarray], row_labels: list[str], column_labels: list[str]):
    """One labelled row of frames per entry of ``rows`` (uint8 [n, H, W, 3] each, all of one frame
    size; a row may hold fewer frames than there are columns: its last cells stay white), the row's
    label at its left and the column labels on top. Returns a PIL RGB image."""
    from PIL import Image, ImageDraw

    h, w = rows[0].shape[1:3]
    label_w, top = 8 * max(len(s) for s in row_labels) + 10, 14
    sheet = Image.new("RGB", (label_w + w * len(column_labels), top + h * len(rows)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    small = font(11)
    for j, text in enumerate(column_labels):
        draw.text((label_w + j * w + 3, 1), text, fill=(0, 0, 0), font=small)
    for i, (frames, label) in enumerate(zip(rows, row_labels)):
        draw.text((3, top + i * h + h // 2 - 6), label, fill=(0, 0, 0), font=small)
        for j, frame in enumerate(frames[:len(column_labels)]):
            sheet.paste(Image.fromarray(np.ascontiguousarray(frame)), (label_w + j * w, top + i * h))
    return sheet


__all__ = ["font", "frame_sheet"]
