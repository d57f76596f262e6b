"""docs/continue-look-back.jpg: a real first visit, then the generated return (README, docs/continue.md).

Runs the product's own command, ``worldtrace compare trajectories/look_back.yaml --cache
sliding,field,landmark --prefix truth:4 --world-seed 8 --scale 2``, into a scratch folder and saves its
``compare.png`` (truth first, the prefix's chunks framed) as the JPEG the docs show. About 1 minute on a
2-core CPU. Usage: ``python benchmarks/continue_figure.py [OUT_DIR]``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="continue-figure-"))
    subprocess.run(["worldtrace", "compare", str(ROOT / "trajectories" / "look_back.yaml"), "--cache",
                    "sliding,field,landmark", "--prefix", "truth:4", "--world-seed", "8", "--metrics", "fast",
                    "--scale", "2", "-o", str(out), "--overwrite", "--no-progress"], check=True)
    Image.open(out / "compare.png").convert("RGB").save(ROOT / "docs" / "continue-look-back.jpg", quality=88)
    print(out / "compare.md")


if __name__ == "__main__":
    main()
