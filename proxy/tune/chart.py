"""One PNG per request class: decode tok/s per setting, median with the spread over repeats.

matplotlib comes with the ``plot`` extra (``pip install 'mtp-proxy[plot]'``); without it the
charts are skipped and the caller says so once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def chart_name(label: str) -> str:
    """File name of a class's chart: '16k-32k/code' -> 'chart-16k-32k-code.png'."""
    safe = re.sub(r"[^A-Za-z0-9]+", "-", label.replace("<", "lt")).strip("-")
    return f"chart-{safe}.png"


def write_charts(out: Path, rows: list[dict[str, Any]], title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    for label in dict.fromkeys(row["class"] for row in rows):
        cells = [row for row in rows if row["class"] == label]
        names = [row["setting_name"] for row in cells]
        medians = [row["tok_s"] for row in cells]
        lo = [row["tok_s"] - row["spread"]["tok_s"]["lo"] for row in cells]
        hi = [row["spread"]["tok_s"]["hi"] - row["tok_s"] for row in cells]
        colours = [_colour(row["verdict"]) for row in cells]
        fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(cells) + 1.5), 3.2), dpi=100)
        ax.bar(names, medians, yerr=[lo, hi], capsize=3, color=colours)
        off = next((row["tok_s"] for row in cells if row["setting_name"] == "off"), None)
        if off is not None:
            ax.axhline(off, color="grey", linewidth=0.8, linestyle="--")
        ax.set_ylabel("decode tok/s")
        ax.set_title(f"{title}: {label}", fontsize=10)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        fig.tight_layout()
        path = out / chart_name(label)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _colour(verdict: str) -> str:
    if "best" in verdict:
        return "#2a9d55"
    if "faster" in verdict:
        return "#8cc9a0"
    if "slower" in verdict:
        return "#d9825b"
    return "#9aa7b8"
