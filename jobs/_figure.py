"""The one way jobs/ save a plot (``_util`` and ``lab_common`` both re-export it). No MPI."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["save_figure"]


def save_figure(path: Path | None, draw, dpi: int = 100) -> None:
    """``draw(plt)`` returns a figure, saved to ``path`` (its folder made); no path: skipped;
    no matplotlib: a warning. The PNG carries no software stamp, so a rerun that draws the
    same figure writes the same bytes."""
    if path is None:
        return
    try:
        import matplotlib
    except ImportError:
        print(f"# no matplotlib: skipped {path} (pip install matplotlib)", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = draw(plt)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    print(f"# wrote {path}", flush=True)
