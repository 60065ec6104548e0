"""The two committed figures of the README and the results pages, drawn from the committed results with the
report's own figure functions (fi_toolkit/report/kinds/nearfar.py, retention.py); no model, about half a minute.

    PYTHONPATH=. .venv/bin/python docs/make_figures.py

* docs/images/nearfar.png: ``nearfar.nearfar_distance`` on analyses/results/nearfar-p1024/. Only the summary over
  documents is committed (not the per-document nearfar.csv), so the lines are the means over the 5 documents,
  without the 95 % bands that ``fi report`` draws from a full run directory (the committed summary's intervals are
  the Student-t intervals of the code that wrote it, which the report no longer uses).
* docs/images/accuracy_vs_retention.png: ``retention.accuracy_vs_retention`` on analyses/results/eval/tasks/,
  the same figure as ``fi report analyses/results/eval/tasks --format md --out DIR``
  (DIR/figures/tasks__accuracy_vs_retention.png).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from fi_toolkit.report.export import load_run
from fi_toolkit.report.kinds import eval_tasks, nearfar, retention
from fi_toolkit.studies.nearfar import METRICS

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


def nearfar_figure(run: Path, out: Path) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    summary = pd.read_csv(run / "nearfar_summary.csv")
    # its intervals were written by the Student-t summary of the time: not drawn (the report draws bootstrap bands)
    means = summary.assign(**{f"{m}_{b}": float("nan") for m in METRICS for b in ("ci_low", "ci_high")})
    text = nearfar.caption({"manifest": manifest}) + " | lines: means over the documents (committed summary, no bands)"
    fig = nearfar.nearfar_distance(means, text)
    fig.savefig(out, dpi=90)


def accuracy_figure(run: Path, out: Path) -> None:
    loaded = load_run(run)
    fig = retention.accuracy_vs_retention(loaded["tables"]["task_summary"], eval_tasks.caption(loaded))
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    IMAGES.mkdir(parents=True, exist_ok=True)
    nearfar_figure(ROOT / "analyses" / "results" / "nearfar-p1024", IMAGES / "nearfar.png")
    accuracy_figure(ROOT / "analyses" / "results" / "eval" / "tasks", IMAGES / "accuracy_vs_retention.png")
    print(f"wrote {IMAGES / 'nearfar.png'} and {IMAGES / 'accuracy_vs_retention.png'}")
