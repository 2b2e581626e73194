"""The benchmark plots of the performance page, drawn from the results files (matplotlib).

Each SVG carries the hash of the data it shows (`figures.plot_digest`) in its
metadata, so `generate.py --check` can tell a stale plot without comparing drawings.
"""

from __future__ import annotations

from pathlib import Path

import figures
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OURS = "#1f6feb"
OTHERS = "#8b949e"


def _save(figure: plt.Figure, name: str) -> Path:
    figures.PLOTS.mkdir(parents=True, exist_ok=True)
    path = figures.PLOTS / f"{name}.svg"
    plt.rcParams["svg.hashsalt"] = name  # stable element ids: small diffs between runs
    figure.savefig(path, format="svg", bbox_inches="tight",
                   metadata={"Date": None, "Description": f"data {figures.plot_digest(name)}"})
    plt.close(figure)
    return path


def _subtitle(script: str) -> str:
    _, run = figures.results(script)
    kind = "quick run" if run.quick else "full run"
    return f"{script}.py, {kind} of {run.date}, load {run.load_average['start'][0]:.2f}"


def throughput() -> Path:
    script, key, alt = figures.PLOT_DATA["throughput"]
    table = figures.results(script)[0].table(key)
    # Rows whose rate a second run did not reproduce (compare_runs.py) are not drawn;
    # a row measured in two malloc regimes is named with its regime.
    rows = [row for row in table.rows[::-1] if isinstance(row.get("rate"), (int, float))]
    figure, axes = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    colors = [OURS if row["pipeline"].startswith("resumeloader") else OTHERS for row in rows]
    names = [row["pipeline"].replace("`", "") + (f" [{row['malloc']}]" if row.get("malloc")
                                                  else "") for row in rows]
    axes.barh(names, [row["rate"] for row in rows], color=colors)
    axes.set_xscale("log")
    axes.set_xlabel("records/s (log scale)")
    axes.set_title(f"{alt}\n{_subtitle(script)}", fontsize=10)
    return _save(figure, "throughput")


def restore() -> Path:
    script, key, alt = figures.PLOT_DATA["restore"]
    table = figures.results(script)[0].table(key)
    positions = [(column.key, int(column.key.split("_")[1])) for column in table.columns[1:]]
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for row in table.rows:
        points = [(max(p, 1), row[k]) for k, p in positions if isinstance(row[k], (int, float))]
        style = "-o" if row["method"].startswith("resumeloader") else "--s"
        axes.plot(*zip(*points, strict=True), style, label=row["method"].replace("`", ""))
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("position restored (records consumed; 0 drawn at 1)")
    axes.set_ylabel("ms to the first batch (log scale)")
    axes.set_title(f"{alt}\n{_subtitle(script)}", fontsize=10)
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1)
    return _save(figure, "restore")


ALL = {"throughput": throughput, "restore": restore}
