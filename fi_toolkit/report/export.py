"""``fi report``: result directories -> a self-contained HTML page, Markdown, CSV and JSON tables.

The tables are the result files themselves: CSV files are copied byte for byte, JSON holds the
same rows read back at full precision, and the tables shown in HTML and Markdown carry each
cell's text exactly as the CSV file has it. Every string from the data (document names, token
text) is HTML-escaped before it reaches the page; figures are embedded as base64 PNG.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import shutil
from pathlib import Path
from typing import Sequence

import pandas as pd

from .. import results
from ..analysis.runs import read_table
from ..errors import FIError
from . import figures

FORMATS = ("html", "md", "csv", "json")
# Tables of each run kind, in display order; the ones shown in HTML/Markdown are marked True.
TABLES = {
    "correlate": [("correlation_summary", True), ("correlations", False), ("tokens", False)],
    "nearfar": [("nearfar_summary", True), ("nearfar_tests", True), ("token_class_summary", True),
                ("nearfar", False), ("token_classes", False)],
}
SHOWN_COLUMNS = {  # columns shown in HTML/Markdown (all columns stay in CSV/JSON)
    "correlation_summary": ["chunk", "signal", "scope", "layer", "method", "rho_mean", "rho_std", "rho_min",
                            "rho_max", "n_documents"],
}


def parse_formats(text: str) -> list[str]:
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise FIError(f"invalid --format '{text}': choose from {','.join(FORMATS)}")
    return formats


def load_run(path: Path) -> dict:
    """A finished result directory -> {label, path, manifest, kind, tables (DataFrames), text (str cells)}."""
    path = Path(path)
    manifest_file = path / "manifest.json"
    if not manifest_file.exists():
        raise FIError(f"'{path}' is not a finished fi correlate/nearfar result directory (no manifest.json)")
    try:
        manifest = json.loads(manifest_file.read_text())
    except json.JSONDecodeError:
        raise FIError(f"'{manifest_file}' is not valid JSON") from None
    kind = manifest.get("command")
    if kind not in TABLES:
        raise FIError(f"'{path}' holds a '{kind}' run; fi report reads correlate and nearfar runs")
    tables, text = {}, {}
    for name, _shown in TABLES[kind]:
        f = path / f"{name}.csv"
        if not f.exists():
            raise FIError(f"'{path}' lacks {name}.csv; was the run interrupted? finish it with --resume")
        tables[name] = read_table(f)
        text[name] = pd.read_csv(f, dtype=str, keep_default_na=False)
    return {"label": path.name, "path": path, "manifest": manifest, "kind": kind, "tables": tables, "text": text}


def _figures(run: dict) -> list[tuple[str, object]]:
    cap, t = figures.caption(run["manifest"]), run["tables"]
    if run["kind"] == "nearfar":
        made = [("fi_vs_distance", figures.nearfar_distance(t["nearfar"], cap)),
                ("token_classes", figures.token_classes(t["token_class_summary"], cap))]
    else:
        made = [("fi_vs_signals", figures.fi_vs_signals(t["tokens"], cap)),
                ("rho_heatmap", figures.rho_heatmap(t["correlation_summary"], cap)),
                ("rho_vs_distance", figures.rho_vs_distance(t["correlations"], cap))]
    return [(name, fig) for name, fig in made if fig is not None]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    figures.plt.close(fig)
    return buf.getvalue()


def _json_value(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: _json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _shown(run: dict, name: str) -> pd.DataFrame:
    df = run["text"][name]
    cols = [c for c in SHOWN_COLUMNS.get(name, df.columns) if c in df.columns]
    if name == "correlation_summary":  # the per-layer rows live in the heatmap and the CSV
        df = df[df["scope"] == "mean"]
    return df[cols]


def _md_table(df: pd.DataFrame) -> str:
    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cell(c) for c in df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _html_table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _top_tokens(run: dict, n: int = 12) -> pd.DataFrame | None:
    if run["kind"] != "correlate":
        return None
    text = run["text"]["tokens"]
    first = text["chunk"].iloc[0] if len(text) else None
    part = text[text["chunk"] == first]
    order = run["tables"]["tokens"].loc[part.index, "fi"].sort_values(ascending=False).index[:n]
    return part.loc[order, ["document", "position", "token", "chunk", "fi", "entropy", "attention"]]


def _headline(run: dict) -> list[str]:
    """A few plain sentences of what the tables say (numbers from the tables, nothing new)."""
    t = run["tables"]
    lines = []
    if run["kind"] == "nearfar":
        tests = t["nearfar_tests"]
        far = tests[(tests["metric"].isin(["fi", "fi_share_near"])) & (tests["distance_from_p"] == tests["distance_from_p"].max())]
        for r in far.itertuples():
            lines.append(f"sinks={r.sinks}, farthest chunk (+{r.distance_from_p}), {r.metric}: entropy beats attention in "
                         f"{r.a_wins}/{r.n_documents} documents, one-sided Wilcoxon p = {r.wilcoxon_p:.3g}")
    else:
        s = t["correlation_summary"]
        m = s[(s["scope"] == "mean") & (s["method"] == "spearman")]
        for r in m.itertuples():
            lines.append(f"chunk {r.chunk}: Spearman rho(FI, {r.signal}) = {r.rho_mean:.3f} "
                         f"(range {r.rho_min:.3f} .. {r.rho_max:.3f} over {r.n_documents} document(s))")
    return lines


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}code{background:#f5f5f5}.cap{color:#555;font-size:13px}"""


def build_report(run_dirs: Sequence[Path], out_dir: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the report of ``run_dirs`` into ``out_dir`` in ``formats``; returns the files written."""
    if not run_dirs:
        raise FIError("no result directory given: fi report RUN_DIR [RUN_DIR ...]")
    runs = [load_run(p) for p in run_dirs]
    labels: dict[str, int] = {}
    for run in runs:  # unique labels even for runs/a/corr and runs/b/corr
        labels[run["label"]] = labels.get(run["label"], 0) + 1
        if labels[run["label"]] > 1:
            run["label"] = f"{run['label']}-{labels[run['label']]}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    figs = {run["label"]: [(name, _png(fig)) for name, fig in _figures(run)] for run in runs} \
        if {"html", "md"} & set(formats) else {}
    if "csv" in formats:
        for run in runs:
            for name, _ in TABLES[run["kind"]]:
                target = out_dir / "tables" / f"{run['label']}__{name}.csv"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run["path"] / f"{name}.csv", target)
                written.append(target)
    if "json" in formats:
        data = {"generated": results.now(), "runs": [
            {"label": r["label"], "directory": str(r["path"]), "command": r["kind"], "manifest": r["manifest"],
             "tables": {name: _records(df) for name, df in r["tables"].items()}} for r in runs]}
        results.atomic_write_text(out_dir / "report.json", json.dumps(data, indent=1, allow_nan=False, default=str) + "\n")
        written.append(out_dir / "report.json")
    if "md" in formats:
        written.append(_write_markdown(runs, figs, out_dir))
    if "html" in formats:
        written.append(_write_html(runs, figs, out_dir))
    return written


def _write_markdown(runs, figs, out_dir: Path) -> Path:
    parts = ["# Forward Influence report", ""]
    for run in runs:
        parts += [f"## {run['label']} ({run['kind']})", "", figures.caption(run["manifest"]), ""]
        parts += [f"- {line}" for line in _headline(run)] + [""]
        for name, png in figs.get(run["label"], []):
            f = out_dir / "figures" / f"{run['label']}__{name}.png"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(png)
            parts += [f"![{name}](figures/{f.name})", ""]
        for name, shown in TABLES[run["kind"]]:
            if shown:
                parts += [f"### {name}", "", _md_table(_shown(run, name)), ""]
        top = _top_tokens(run)
        if top is not None:
            parts += ["### tokens with the largest per-token FI (first chunk)", "", _md_table(top), ""]
        parts += [f"Full tables: `{run['path']}` (CSV), and `tables/`, `report.json` here.", ""]
    path = out_dir / "report.md"
    results.atomic_write_text(path, "\n".join(parts))
    return path


def _write_html(runs, figs, out_dir: Path) -> Path:
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Forward Influence report</title>"
             f"<style>{CSS}</style></head><body><h1>Forward Influence report</h1>"]
    for run in runs:
        parts.append(f"<h2>{e(run['label'])} ({e(run['kind'])})</h2><p class='cap'>{e(figures.caption(run['manifest']))}</p>")
        parts.append("<ul>" + "".join(f"<li>{e(line)}</li>" for line in _headline(run)) + "</ul>")
        for name, png in figs.get(run["label"], []):
            parts.append(f"<figure><img alt='{e(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'/></figure>")
        for name, shown in TABLES[run["kind"]]:
            if shown:
                parts.append(f"<h3>{e(name)}</h3>{_html_table(_shown(run, name))}")
        top = _top_tokens(run)
        if top is not None:
            parts.append(f"<h3>tokens with the largest per-token FI (first chunk)</h3>{_html_table(top)}")
    parts.append("</body></html>")
    path = out_dir / "report.html"
    results.atomic_write_text(path, "\n".join(parts))
    return path
