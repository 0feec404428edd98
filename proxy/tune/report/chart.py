"""Charts a person reads alone: one PNG per request class, and a summary.

``chart-<class>.png`` (the class label kept: ``chart-64k+-code.png``, ``chart-lt4k-prose.png``):
one bar per setting, spelled out (n_max 3 / n_min 1), the median decode tok/s over the repeats
with whiskers from the slowest to the fastest repeat, the paired speedup over off written on
each bar (the table's figure), off's speed as a labelled line, and a legend for the colours.
``chart-summary.png``: per class, its best setting and that setting's paired speedup over off,
whiskers over the repeats, 1.0x (off) as a labelled line.

The bars are medians of tok/s and the figure on a bar is the median of per-repeat paired ratios:
the two can differ (a repeat's mix of answered requests), and each chart says which is which.

matplotlib comes with the ``plot`` extra (``pip install 'mtp-proxy[plot]'``); without it the
charts are skipped and the caller says so once.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import shlex
import sys
from pathlib import Path
from typing import Any

from proxy.tune.report.labels import file_part

_COLOURS = {
    "faster than off": "#2a9d55",
    "within spread of off": "#9aa7b8",
    "one repeat: no spread": "#c9cfd8",
    "slower than off": "#d9825b",
    "off": "#5b6b80",
}
_LEGEND = {
    "faster than off": "faster than off beyond the spread",
    "within spread of off": "within the spread of off",
    "one repeat: no spread": "one repeat: no spread to judge",
    "slower than off": "slower than off beyond the spread",
    "off": "off (no drafting)",
}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def install_command() -> str:
    """The one command that adds the charts to this environment (scripts/serve.sh's virtualenv
    has no plot extra): this interpreter's pip and the plot extra's requirement."""
    needed = "matplotlib"
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for requirement in importlib.metadata.requires("mtp-proxy") or []:
            if requirement.startswith("matplotlib") and 'extra == "plot"' in requirement:
                needed = requirement.split(";")[0].strip()
    command = shlex.join([sys.executable, "-m", "pip", "install", needed])
    return f"add them with `{command}`, then rerun the same command (it measures nothing again)"


def chart_name(label: str) -> str:
    """File name of a class's chart: '64k+/code' -> 'chart-64k+-code.png'."""
    return f"chart-{file_part(label)}.png"


SUMMARY = "chart-summary.png"


def category(row: dict[str, Any]) -> str:
    """The colour a bar gets: how its verdict compares it with off."""
    if row["setting_name"] == "off":
        return "off"
    for word in ("faster than off", "slower than off", "one repeat: no spread"):
        if word in row["verdict"]:
            return word
    return "within spread of off"


def bar_label(row: dict[str, Any]) -> str:
    """What is written on a bar: the paired speedup over off; "best" on the class's best."""
    best = "\nbest" if row["verdict"].startswith("best") else ""
    if row["setting_name"] == "off":
        return "off" + best
    return ("-" if row["speedup"] is None else f"{row['speedup']:.2f}x") + best


def write_charts(out: Path, rows: list[dict[str, Any]], model: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    for label in dict.fromkeys(row["class"] for row in rows):
        cells = [row for row in rows if row["class"] == label]
        fig = _class_chart(plt, cells, model)
        path = out / chart_name(label)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    fig = _summary_chart(plt, rows, model)
    if fig is not None:
        fig.savefig(out / SUMMARY)
        plt.close(fig)
        written.append(out / SUMMARY)
    return written


def _class_chart(plt: Any, cells: list[dict[str, Any]], model: str) -> Any:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = [row["setting_words"].replace(" / ", "\n") for row in cells]
    medians = [row["tok_s"] for row in cells]
    lo = [row["tok_s"] - row["spread"]["tok_s"]["lo"] for row in cells]
    hi = [row["spread"]["tok_s"]["hi"] - row["tok_s"] for row in cells]
    kinds = [category(row) for row in cells]
    fig, ax = plt.subplots(figsize=(max(6.5, 0.95 * len(cells) + 3.5), 4.8), dpi=100)
    x = list(range(len(cells)))
    ax.bar(x, medians, color=[_COLOURS[k] for k in kinds], edgecolor="#333333", linewidth=0.4)
    ax.errorbar(x, medians, yerr=[lo, hi], fmt="none", ecolor="#222222", capsize=4, lw=1)
    top = max(row["spread"]["tok_s"]["hi"] for row in cells)
    for i, row in enumerate(cells):
        ax.text(
            i, row["spread"]["tok_s"]["hi"] + top * 0.02, bar_label(row),
            ha="center", va="bottom", fontsize=8, fontweight="bold",
        )  # fmt: skip
    handles: list[Any] = []
    off = next((row for row in cells if row["setting_name"] == "off"), None)
    if off is not None:
        ax.axhline(off["tok_s"], color="#5b6b80", linewidth=1, linestyle="--")
        handles.append(
            Line2D([], [], color="#5b6b80", ls="--", label=f"off: {off['tok_s']:.1f} tok/s")
        )
    repeats = max(row["repeats"] for row in cells)
    handles.append(
        Line2D([], [], color="#222222", marker="_", markersize=10, lw=1,
               label=f"whiskers: slowest-fastest of {repeats} repeat(s)")
    )  # fmt: skip
    handles += [Patch(color=_COLOURS[k], label=_LEGEND[k]) for k in _COLOURS if k in kinds]
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, top * 1.18)
    ax.set_ylabel("decode tok/s (median over the repeats)")
    ax.set_title(f"{model}: {cells[0]['class_words']}", fontsize=11)
    note = (
        "bars: median decode tok/s over the repeats; on each bar: the speedup over off, paired by "
        "repeat on the same requests (the table's figure, which is not the ratio of the bars); "
        "best: the highest median of the class"
    )
    return _finished(fig, ax, handles, note)


def _finished(fig: Any, ax: Any, handles: list[Any], note: str) -> Any:
    """The legend right of the chart, and the note under it, wrapped to the figure's width."""
    import textwrap

    width = int(fig.get_figwidth() * 100 / 5.2)  # characters of 7.5 pt that fit the width
    fig.text(0.01, 0.01, textwrap.fill(note, width), ha="left", va="bottom", fontsize=7.5,
             color="#333333")  # fmt: skip
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def best_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best setting (highest median tok/s) of each class, in the table's class order."""
    out = []
    for label in dict.fromkeys(row["class"] for row in rows):
        cells = [row for row in rows if row["class"] == label]
        out.append(max(cells, key=lambda row: row["tok_s"]))
    return out


def _summary_chart(plt: Any, rows: list[dict[str, Any]], model: str) -> Any:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    best = best_rows(rows)
    if not best:
        return None
    values, lo, hi, kinds = [], [], [], []
    for row in best:
        speedup = 1.0 if row["setting_name"] == "off" else (row["speedup"] or 0.0)
        spread = row["spread"]["speedup"] or {"lo": speedup, "hi": speedup}
        values.append(speedup)
        lo.append(max(speedup - spread["lo"], 0.0))
        hi.append(max(spread["hi"] - speedup, 0.0))
        kinds.append(category(row))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.05 * len(best) + 3.5), 4.8), dpi=100)
    x = list(range(len(best)))
    ax.bar(x, values, color=[_COLOURS[k] for k in kinds], edgecolor="#333333", linewidth=0.4)
    ax.errorbar(x, values, yerr=[lo, hi], fmt="none", ecolor="#222222", capsize=4, lw=1)
    top = max(v + h for v, h in zip(values, hi, strict=True))
    for i, row in enumerate(best):
        text = "off" if row["setting_name"] == "off" else (
            f"{row['setting_words'].replace(' / ', chr(10))}\n{values[i]:.2f}x"
        )  # fmt: skip
        ax.text(i, values[i] + hi[i] + top * 0.02, text, ha="center", va="bottom", fontsize=7.5)
    ax.axhline(1.0, color="#5b6b80", linewidth=1, linestyle="--")
    handles: list[Any] = [
        Line2D([], [], color="#5b6b80", ls="--", label="off = 1.0x"),
        Line2D([], [], color="#222222", marker="_", markersize=10, lw=1,
               label="whiskers: lowest-highest paired speedup over the repeats"),
    ]  # fmt: skip
    handles += [Patch(color=_COLOURS[k], label=_LEGEND[k]) for k in _COLOURS if k in kinds]
    ax.set_xticks(x, [row["class_words"].replace(", ", ",\n", 1) for row in best], fontsize=7.5)
    ax.set_ylim(0, max(top * 1.25, 1.2))
    ax.set_ylabel("speedup over off (paired, median)")
    ax.set_title(f"{model}: the best setting of each request class", fontsize=11)
    note = (
        "one bar per request class: its best setting (highest median tok/s, as in the table); "
        "height and figure: that setting's speedup over off, paired by repeat on the same "
        "requests"
    )
    return _finished(fig, ax, handles, note)
