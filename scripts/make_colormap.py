"""Writes tasks/colormap.py: matplotlib's 256-entry 'magma' colour map as uint8 RGB, so the release preview
(tasks/preview.py) colours its map with Pillow and numpy and never imports matplotlib at run time.

    .venv/bin/python scripts/make_colormap.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps

NAME = "magma"


def main() -> None:
    rgb = np.round(colormaps[NAME](np.arange(256))[:, :3] * 255).astype(np.uint8).tobytes().hex()
    rows = "\n".join(f'    "{rgb[i:i + 96]}"' for i in range(0, len(rgb), 96))
    out = Path(__file__).resolve().parents[1] / "tasks" / "colormap.py"
    out.write_text(f'''"""matplotlib's '{NAME}' colour map, 256 entries of uint8 RGB (written by scripts/make_colormap.py)."""

from __future__ import annotations

import numpy as np

NAME = "{NAME}"

#: LUT[i] is the RGB of level i / 255 of the map, as matplotlib's colormaps["{NAME}"] gives it.
LUT: np.ndarray = np.frombuffer(bytes.fromhex(
{rows}
), dtype=np.uint8).reshape(256, 3)
''')


if __name__ == "__main__":
    main()
