"""``fi report``: result directories -> a self-contained HTML page, Markdown, CSV and JSON tables.

The tables are the result files themselves: CSV files are copied byte for byte and JSON holds the
same rows read back at full precision; the tables shown in HTML and Markdown are the CSV cells in a
reader's form (:mod:`fi_toolkit.report.display`: at most 4 significant digits, integers as integers,
bounds folded into their value's column, names in words), wide ones in a container that scrolls
sideways. ``fi view`` pages found in a run directory (``*.html`` or ``views/*.html``, of the run's
documents) are copied to ``views/``, each with a link back to the report, and linked. Every string from
the data (document names, token text, run labels) is HTML-escaped before it reaches the page or the
Markdown (which renderers read as HTML too); Markdown image links are URL-encoded; figures are embedded as base64 PNG.

Every file is written or copied atomically. An --out that already holds a report (or any results)
is refused unless ``overwrite``; then the new report replaces the old one, stale files included.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import urllib.parse
from pathlib import Path
from typing import Sequence

import pandas as pd

from fi_toolkit.errors import FIError
from fi_toolkit.report import eval_figures, field_figures, figures, lmeval
from fi_toolkit.report.display import display_table, split_settings, text_cells
from fi_toolkit.report.headline import headline
from fi_toolkit.report.headroom import headroom_figure
from fi_toolkit.report.lead import LeadTable, lead_table
from fi_toolkit.report.preflight import (  # noqa: F401
    FORMATS,
    REPORT_FILES,
    REPORT_MARK,
    check_report_out,
    check_run_dirs,
    not_a_run,
    parse_formats,
    report_entry,
)
from fi_toolkit.report.token_page import read_view_meta, with_report_link
from fi_toolkit.runs import results
from fi_toolkit.runs.resumable import read_table
from fi_toolkit.studies.random_baseline import versus_random

# Tables of each run kind, in display order; the ones shown in HTML/Markdown are marked True.
TABLES = {
    "correlate": [("correlation_summary", True), ("correlations", False), ("tokens", False)],
    "nearfar": [
        ("nearfar_summary", True),
        ("nearfar_tests", True),
        ("token_class_summary", True),
        ("nearfar", False),
        ("token_classes", False),
    ],
    "eval-text": [
        ("replay_summary", True),
        ("segment_summary", False),
        ("replays", False),
        ("segments", False),
        ("positions", False),
    ],
    "eval-tasks": [("task_summary", True), ("kl_accuracy", True), ("answers", False)],
    "probe": [("fi", True)],
    "field": [
        ("leaderboard", True),
        ("tests", True),
        ("refused", True),
        ("headroom", False),
        ("fi", False),
        ("replays", False),
    ],
}
EVAL_KINDS = {"text": "eval-text", "tasks": "eval-tasks"}  # fi eval writes command 'eval' and settings.kind
# Tables a run holds only with some settings (fi correlate --estimator fisher --validate N), read when present.
OPTIONAL_TABLES = {
    "correlate": [("agreement", True), ("agreement_summary", True), ("validation", False)],
    "probe": [("headroom", True)],  # fi probe beside an FI oracle and random sets
    "field": [("task_summary", True), ("answers", False)],  # fi field --task
}
SHOWN_COLUMNS = {  # columns shown in HTML/Markdown, results first (all columns stay in CSV/JSON)
    "correlation_summary": [
        "chunk",
        "signal",
        "method",
        "rho_mean",
        "rho_std",
        "rho_min",
        "rho_max",
        "share_positive",
        "n_documents",
        "sampling",
        "weighted",
    ],
    "fi": [
        "chunk",
        "selection",
        "document",
        "n_removed",
        "fi",
        "below_noise_floor",
        "n_kept",
        "mean_entropy",
        "mean_attention",
        "mean_distance",
        "mean_infokv",
        "prefix",
        "entropy_of",
    ],
    "headroom": [
        "chunk",
        "n_removed",
        "selection",
        "headroom",
        "ci_low",
        "ci_high",
        "headroom_seed_sd",
        "fi_policy",
        "fi_random",
        "fi_oracle",
        "fi_oracle_seed_sd",
        "oracle_seeds",
        "oracle",
        "fit_chunk",
        "n_documents",
    ],
}
# What each run kind answers (the heading of its part) and what each shown table holds, with units.
KIND_TITLES = {
    "probe": "Forward Influence of token sets (fi probe)",
    "correlate": "Which signal predicts a token's Forward Influence? (fi correlate)",
    "nearfar": "Forward Influence of equal-size sets, near and far (fi nearfar)",
    "eval-text": "Compressed decoding against the full cache (fi eval, text)",
    "eval-tasks": "Task accuracy under compression (fi eval, tasks)",
    lmeval.KIND: "lm-evaluation-harness under compression (fi lm-eval)",
    "field": "The field map: every policy and press against the FI oracle (fi field)",
}
TABLE_TITLES = {
    "fi": "FI (nats) of each token set, per chunk and document; controls first (their FI is the noise floor)",
    "headroom": "Headroom: the share of the random-to-oracle FI gap each set closes (0: random, 1: the FI oracle), "
    "bootstrap 95 % CI over documents, and the oracle's own noise (sd over its label seeds); FI columns in nats",
    "correlation_summary": "Correlation of per-token FI with each signal per chunk: mean ρ over documents, its range "
    "and sd, and the share of documents with ρ > 0",
    "agreement": "Fisher estimate against exact leave-one-out FI, per document (bootstrap 95 % CI)",
    "agreement_summary": "Fisher estimate against exact leave-one-out FI: mean over documents",
    "nearfar_summary": "Equal-size sets per selector and chunk distance: FI (nats), FI / random FI and FI / FI on the "
    "nearest chunk, mean over documents [bootstrap 95 % CI]",
    "nearfar_tests": "Does entropy beat attention? One-sided paired tests over documents per chunk distance "
    "(Wilcoxon signed-rank; t-test of the log ratio)",
    "token_class_summary": "Word classes in each selector's set: share of content words, function words and other "
    "tokens",
    "replay_summary": "Decoding replay per policy and budget: mean KL(full ‖ compressed) (nats), top-1 agreement, "
    "ΔNLL (nats), first divergence of free generation (tokens), kept share [bootstrap 95 % CI over documents]",
    "task_summary": "Task accuracy per policy and budget (exact match) and the answer's KL (nats) [bootstrap 95 % "
    "CI over samples]",
    "kl_accuracy": "Does the answer's KL predict accuracy? Spearman across cells [bootstrap 95 % CI]",
    "leaderboard": "Each method per budget, best first: FI (nats) per chunk, headroom (0: random positions with "
    "sinks kept, 1: the FI oracle) [bootstrap 95 % CI over documents], replay KL (nats), seconds per compression",
    "versus_random": "Each token set against random positions of its size, paired over (document, random seed): "
    "mean FI (nats) of the set and of random, their ratio, pairs where the set is below random, two-sided "
    "Wilcoxon signed-rank p (the pairs of one document share the set's value)",
    "tests": "Is the best method better? Each method against the lowest mean, paired over documents (one-sided "
    "Wilcoxon signed-rank, uncorrected)",
    "refused": "Methods that could not run here, and why",
    lmeval.TABLES[0][0]: "lm-eval score per task, metric, policy and budget [95 % band]",
    lmeval.TABLES[1][0]: "Realised cache per request: entries kept and in the full cache, their share, compressions",
}


def _check_manifest(manifest, manifest_file: Path) -> str:
    """The fields a report reads: a dict with 'command' and 'settings' (documents, chunks); -> the command."""
    if not isinstance(manifest, dict):
        raise FIError(f"'{manifest_file}' is not a run manifest (expected a JSON object)")
    kind = manifest.get("command")
    if kind == "probe" and "settings" not in manifest:  # fi probe's manifest keeps its settings at the top
        manifest["settings"] = {
            k: manifest[k] for k in ("documents", "prefix", "chunks", "selections") if k in manifest
        }
    if kind is None:
        raise FIError(f"'{manifest_file}' lacks the field 'command'; is it a fi correlate/nearfar manifest?")
    settings = manifest.get("settings")
    if kind == "eval" and isinstance(settings, dict):
        kind = EVAL_KINDS.get(settings.get("kind"), kind)
    if kind not in TABLES:
        raise FIError(
            f"'{manifest_file.parent}' holds a '{kind}' run; fi report reads probe, correlate, nearfar, eval and "
            "field runs"
        )
    if not isinstance(settings, dict):
        raise FIError(f"'{manifest_file}' lacks the field 'settings' (an object); was it written by fi {kind}?")
    docs = settings.get("documents", [])
    if not isinstance(docs, list) or not all(isinstance(d, dict) and "name" in d for d in docs):
        raise FIError(f"'{manifest_file}': 'settings.documents' must be a list of objects with a 'name'")
    if not isinstance(settings.get("chunks", []), list) or not isinstance(manifest.get("model", {}), dict):
        raise FIError(f"'{manifest_file}': 'settings.chunks' must be a list and 'model' an object")
    return kind


def load_run(path: Path) -> dict:
    """A finished result directory, read and checked, as the report uses it.

    Args:
        path: the ``--out`` directory of ``fi probe``, ``fi correlate``, ``fi nearfar`` or ``fi eval`` (it
            holds ``manifest.json``), or an lm-eval output directory (``results_*.json`` below it).

    Returns:
        A dict: ``label`` (the directory's name), ``path``, ``manifest``, ``kind`` (``probe``, ``correlate``,
        ``nearfar``, ``eval-text``, ``eval-tasks`` or ``lm-eval``), ``tables`` (name -> ``pandas.DataFrame``
        as typed), ``text`` (name -> the same cells as CSV text), ``names`` (``(table, shown)`` in display
        order) and ``views`` (the ``fi view`` pages of its documents).

    Raises:
        FIError: no manifest, an unreadable manifest or table, or a table missing (an interrupted run).
    """
    path = Path(path)
    manifest_file = path / "manifest.json"
    if lmeval.is_lmeval_dir(path):  # lm-eval's output (fi lm-eval): tables computed from its JSON files
        return lmeval.load_lmeval_run(path)
    if not manifest_file.is_file():
        raise not_a_run(path)
    try:
        manifest = json.loads(manifest_file.read_text())
    except (ValueError, OSError):
        raise FIError(f"'{manifest_file}' is not valid JSON") from None
    kind = _check_manifest(manifest, manifest_file)
    tables, text = {}, {}
    names = TABLES[kind] + [t for t in OPTIONAL_TABLES.get(kind, []) if (path / f"{t[0]}.csv").exists()]
    for name, _shown in names:
        f = path / f"{name}.csv"
        if not f.exists():
            raise FIError(f"'{path}' lacks {name}.csv; was the run interrupted? finish it by resuming it")
        try:
            tables[name] = read_table(f)
            text[name] = pd.read_csv(f, dtype=str, keep_default_na=False)
        except (ValueError, pd.errors.ParserError):  # EmptyDataError is a ValueError
            raise FIError(f"'{f}' is not a readable CSV table") from None
    derived = _derived_tables(kind, tables)
    for name, df in derived.items():
        tables[name], text[name] = df, text_cells(df)
        names.append((name, True))
    return {
        "label": path.name,
        "path": path,
        "manifest": manifest,
        "kind": kind,
        "tables": tables,
        "text": text,
        "names": names,
        "derived": list(derived),
        "views": _views(path, manifest),
    }


def _derived_tables(kind: str, tables: dict) -> dict[str, pd.DataFrame]:
    """Tables the report computes from a run's own (so runs written before them get them too): for a probe,
    every set against random positions of its size (:func:`~fi_toolkit.studies.random_baseline.versus_random`)."""
    if kind == "probe":
        versus = versus_random(tables["fi"])
        return {"versus_random": versus} if len(versus) else {}
    return {}


def _views(path: Path, manifest: dict) -> list[Path]:
    """The ``fi view`` pages in a run directory (``*.html`` or ``views/*.html``) of the documents it covers."""
    names = {d["name"] for d in manifest["settings"].get("documents", [])}
    found = sorted(path.glob("*.html")) + sorted((path / "views").glob("*.html"))
    return [f for f in found if (meta := read_view_meta(f)) is not None and meta["document"] in names]


def _figures(run: dict) -> list[tuple[str, object]]:
    cap, t = _caption(run), run["tables"]
    if run["kind"] == "eval-text":
        made = [
            ("replay_vs_retention", eval_figures.replay_vs_retention(t["replay_summary"], cap)),
            ("kl_over_position", eval_figures.kl_over_position(t["positions"], t["segments"], cap)),
        ]
    elif run["kind"] == lmeval.KIND:
        made = [("accuracy_vs_budget", lmeval.accuracy_vs_budget(t["lmeval_accuracy"], cap))]
    elif run["kind"] == "eval-tasks":
        made = [("accuracy_vs_retention", eval_figures.accuracy_vs_retention(t["task_summary"], cap))]
    elif run["kind"] == "probe":
        made = [("versus_random", figures.probe_versus_random(t["fi"], cap))]
        made += [("headroom", headroom_figure(t["headroom"], cap))] if "headroom" in t else []
    elif run["kind"] == "field":
        made = [
            ("field_headroom", field_figures.field_headroom(t["leaderboard"], cap)),
            ("fi_vs_replay", field_figures.fi_vs_replay(t["leaderboard"], cap)),
        ]
        if "task_summary" in t:  # fi field --task: each method's accuracy at each budget, the full cache's beside
            made.append(("accuracy_vs_budget", eval_figures.accuracy_vs_retention(t["task_summary"], cap)))
    elif run["kind"] == "nearfar":
        made = [
            ("fi_vs_distance", figures.nearfar_distance(t["nearfar_summary"], cap)),
            ("token_classes", figures.token_classes(t["token_class_summary"], cap)),
        ]
    else:
        made = [
            ("fi_vs_signals", figures.fi_vs_signals(t["tokens"], cap)),
            ("rho_heatmap", figures.rho_heatmap(t["correlation_summary"], cap)),
            ("rho_vs_distance", figures.rho_vs_distance(t["correlations"], cap)),
        ]
        if "validation" in t:
            made.append(("estimate_vs_exact", figures.estimate_vs_exact(t["validation"], cap)))
    return [(name, fig) for name, fig in made if fig is not None]


def _caption(run: dict) -> str:
    if run["kind"] == lmeval.KIND:
        return lmeval.caption(run)
    return (
        eval_figures.eval_caption(run["manifest"])
        if run["kind"].startswith("eval")
        else figures.caption(run["manifest"])
    )


def cross_run_tables(runs: list[dict]) -> pd.DataFrame | None:
    """With a text and a task eval run: does mean replay KL predict task accuracy across (policy, budget)?"""
    from fi_toolkit.evaluation.summaries import kl_accuracy_table

    text = [r for r in runs if r["kind"] == "eval-text"]
    tasks = [r for r in runs if r["kind"] == "eval-tasks"]
    bench = [r for r in runs if r["kind"] == lmeval.KIND]
    if not text or not (tasks or bench):
        return None
    replay = pd.concat([r["tables"]["replay_summary"] for r in text], ignore_index=True)
    parts = []
    if tasks:
        answers = pd.concat([r["tables"]["task_summary"] for r in tasks], ignore_index=True)
        parts.append(kl_accuracy_table(answers, replay).iloc[1:])
    if bench:
        parts.append(lmeval.kl_vs_benchmark(replay, pd.concat([r["tables"]["lmeval_accuracy"] for r in bench])))
    return pd.concat(parts, ignore_index=True)


def _figure_title(fig, name: str) -> str:
    """What a figure shows: its suptitle (which names the quantities and their units), else its name."""
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    return title or name.replace("_", " ")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")  # legends outside the axes stay in
    figures.plt.close(fig)
    return buf.getvalue()


def _json_value(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: _json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _shown(run: dict, name: str) -> pd.DataFrame:
    """The table as shown: its CSV text in :func:`~fi_toolkit.report.display.display_table`'s reading form,
    the columns of :data:`SHOWN_COLUMNS` first (the others follow; chunk bounds the chunk label already says
    are left out)."""
    df = run["text"][name]
    first = [c for c in SHOWN_COLUMNS.get(name, []) if c in df.columns]
    derived = {"chunk_start", "chunk_end"} if "chunk" in df.columns else set()
    rest = [c for c in df.columns if c not in first and c not in derived and name not in SHOWN_COLUMNS]
    if name == "correlation_summary":  # the per-layer rows live in the heatmap and the CSV
        df = df[df["scope"] == "mean"]
    return display_table(df[first + rest])


def _md(text) -> str:
    """Markdown-safe text: HTML-escaped (renderers pass raw HTML through), one line, no cell breaks."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def _md_table(df: pd.DataFrame) -> str:
    """A shown table in Markdown; number columns right-aligned (``attrs['numeric']``)."""

    def cell(v):
        return _md(v)

    numeric = set(df.attrs.get("numeric", []))
    rule = "|" + "".join("---:|" if c in numeric else "---|" for c in df.columns)
    lines = ["| " + " | ".join(cell(c) for c in df.columns) + " |", rule]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _html_table(df: pd.DataFrame) -> str:
    """A shown table in a container that scrolls sideways when the table is wider than the page;
    number columns right-aligned (``attrs['numeric']``)."""
    numeric = set(df.attrs.get("numeric", []))
    kinds = ["num" if c in numeric else "txt" for c in df.columns]
    head = "".join(f"<th class='{k}'>{html.escape(str(c))}</th>" for c, k in zip(df.columns, kinds))
    body = "".join(
        "<tr>" + "".join(f"<td class='{k}'>{html.escape(str(v))}</td>" for v, k in zip(row, kinds)) + "</tr>"
        for row in df.itertuples(index=False)
    )
    return f"<div class='table-wrap'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _top_tokens(run: dict, n: int = 12) -> pd.DataFrame | None:
    if run["kind"] != "correlate":
        return None
    text = run["text"]["tokens"]
    first = text["chunk"].iloc[0] if len(text) else None
    part = text[text["chunk"] == first]
    order = run["tables"]["tokens"].loc[part.index, "fi"].sort_values(ascending=False).index[:n]
    return display_table(part.loc[order, ["document", "position", "token", "chunk", "fi", "entropy", "attention"]])


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h2{margin-top:2em;border-bottom:2px solid #ddd}h3{font-size:1.02em;margin:1.2em 0 .3em}.src{font-weight:normal;
color:#777;font-size:12px;font-family:ui-monospace,monospace}.lead{background:#f6f8fb;border-left:4px solid #0072b2;
padding:.2em 1em .6em;margin:1em 0}.lead table{font-size:13px}.settings,.note{font-size:13px;color:#444;margin:.2em 0}
figcaption{font-size:13px;color:#333;margin:.3em 0}
.table-wrap{max-width:100%;overflow-x:auto;margin:0.5em 0 1.5em}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;white-space:nowrap}
th{background:#f3f3f3;position:sticky;top:0}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #eee}figure{margin:1em 0}code{background:#f5f5f5}.cap{color:#555;font-size:13px}"""


def _check_out(out_dir: Path, runs: list[dict], overwrite: bool) -> Path:
    return check_report_out(out_dir, [run["path"] for run in runs], overwrite)  # the command line's checks


def build_report(
    run_dirs: Sequence[Path], out_dir: Path, formats: Sequence[str] = FORMATS, overwrite: bool = False
) -> list[Path]:
    """Write the report of ``run_dirs`` into ``out_dir`` in ``formats``.

    Everything is read and checked before the first file is written; an ``out_dir`` holding a report
    or other results is refused unless ``overwrite``.

    Args:
        run_dirs: result directories (:func:`load_run`), reported in order.
        out_dir: the report directory: ``report.html``, ``report.md``, ``report.json``, ``tables/*.csv``,
            ``figures/*.png``, ``views/*.html`` and ``fi-report.json`` (the mark that fi report wrote it).
        formats: any of :data:`FORMATS`.
        overwrite: replace a report (or other results) already in ``out_dir``; its stale files are removed.

    Returns:
        The files written.

    Raises:
        FIError: a directory that is not a finished run, an ``out_dir`` that is one of them or lies inside
            one, an ``out_dir`` holding results or other files without ``overwrite``
            (:func:`~fi_toolkit.report.preflight.check_report_out`).
    """
    check_run_dirs(run_dirs)
    runs = [load_run(p) for p in run_dirs]
    final = _check_out(Path(out_dir), runs, overwrite)
    with results.staged_dir(final, replaced=report_entry) as out_dir:  # the old report whole or the new one
        written = _write_report(runs, out_dir, formats)
        mark = {"written_by": "fi report", "generated": results.now(), "runs": [str(r["path"]) for r in runs]}
        results.write_json(out_dir / REPORT_MARK, mark)
        written.append(out_dir / REPORT_MARK)
    return [final / p.relative_to(out_dir) for p in written]


def _write_report(runs: list[dict], out_dir: Path, formats: Sequence[str]) -> list[Path]:
    """Every file of the report of ``runs`` into the (new, empty) directory ``out_dir``; -> the files."""
    labels: dict[str, int] = {}
    for run in runs:  # unique labels even for runs/a/corr and runs/b/corr
        labels[run["label"]] = labels.get(run["label"], 0) + 1
        if labels[run["label"]] > 1:
            run["label"] = f"{run['label']}-{labels[run['label']]}"
    written: list[Path] = []
    figs = (
        {run["label"]: [(name, _figure_title(fig, name), _png(fig)) for name, fig in _figures(run)] for run in runs}
        if {"html", "md"} & set(formats)
        else {}
    )
    cross = cross_run_tables(runs)
    results.make_dir(out_dir)
    if "csv" in formats and cross is not None:
        target = out_dir / "tables" / "replay_kl_vs_task_accuracy.csv"
        results.write_table(target, cross)
        written.append(target)
    if "csv" in formats:
        for run in runs:
            for name, _ in run["names"]:
                target = out_dir / "tables" / f"{run['label']}__{name}.csv"
                if run.get("computed") or name in run.get("derived", ()):  # lm-eval runs, derived tables
                    results.write_table(target, run["tables"][name])
                else:
                    results.atomic_copy(run["path"] / f"{name}.csv", target)
                written.append(target)
    if {"html", "md"} & set(formats):  # fi view pages found in the run directories, copied beside the report
        for run in runs:
            run["view_copies"] = []
            for page in run["views"]:
                target = out_dir / "views" / f"{run['label']}__{page.name}"
                index = "../report.html" if "html" in formats else "../report.md"  # the page leads back here
                results.atomic_write_text(target, with_report_link(page.read_text(encoding="utf-8"), index))
                run["view_copies"].append(target)
                written.append(target)
    if "json" in formats:
        data = {
            "generated": results.now(),
            "runs": [
                {
                    "label": r["label"],
                    "directory": str(r["path"]),
                    "command": r["kind"],
                    "manifest": r["manifest"],
                    "tables": {name: _records(df) for name, df in r["tables"].items()},
                }
                for r in runs
            ],
            "replay_kl_vs_task_accuracy": None if cross is None else _records(cross),
        }
        results.atomic_write_text(
            out_dir / "report.json", json.dumps(data, indent=1, allow_nan=False, default=str) + "\n"
        )
        written.append(out_dir / "report.json")
    if "md" in formats:
        written += _write_markdown(runs, figs, out_dir, cross)
    if "html" in formats:
        written.append(_write_html(runs, figs, out_dir, cross))
    return written


CROSS_TITLE = "Does mean replay KL predict task accuracy? (Spearman across policy x budget cells, bootstrap 95% CI)"
TOP_TOKENS_TITLE = "Tokens with the largest per-token FI (nats), first chunk"


def _blocks(run: dict, figs: list[tuple[str, str, bytes]]) -> list[tuple]:
    """What a run's part of the report says, in order, for both writers: its answer first (the lead table and
    the headline), then the figures, then the detail tables, each titled by what it shows."""
    title = f"{KIND_TITLES.get(run['kind'], run['kind'])}: {run['label']}"
    blocks: list[tuple] = [("h2", title), ("caption", _caption(run))]
    lead = lead_table(run)
    if lead is not None:
        blocks.append(("lead", lead))
    blocks.append(("list", headline(run)))
    blocks += [("figure", name, fig_title, png) for name, fig_title, png in figs]
    for name, shown in run["names"]:
        if shown:
            table, settings = split_settings(_shown(run, name))
            blocks.append(("table", TABLE_TITLES.get(name, name), f"{name}.csv", table, settings))
    top = _top_tokens(run)
    if top is not None:
        table, settings = split_settings(top)
        blocks.append(("table", TOP_TOKENS_TITLE, "tokens.csv", table, settings))
    if run.get("view_copies"):
        blocks.append(("views", run["view_copies"]))
    return blocks


def _settings_text(settings: list[tuple[str, str]]) -> str:
    return "; ".join(f"{names}: {value}" for names, value in settings)


def _md_block(block: tuple, run: dict, out_dir: Path, pngs: list[Path]) -> list[str]:
    kind = block[0]
    if kind == "h2":
        return [f"## {_md(block[1])}", ""]
    if kind == "caption":
        return [_md(block[1]), ""]
    if kind == "lead":
        lead: LeadTable = block[1]
        note = [f"*{_md(lead.note)}*", ""] if lead.note else []
        return [f"### Result: {_md(lead.title)}", "", _md_table(lead.table), "", *note]
    if kind == "list":
        return [f"- {_md(line)}" for line in block[1]] + [""]
    if kind == "figure":
        _, name, title, png = block
        f = out_dir / "figures" / f"{run['label']}__{name}.png"
        results.atomic_write_bytes(f, png)
        pngs.append(f)
        return [f"![{_md(title)}](figures/{urllib.parse.quote(f.name)})", "", f"*Figure: {_md(title)}*", ""]
    if kind == "table":
        _, title, source, table, settings = block
        same = [f"*Same in every row:* {_md(_settings_text(settings))}", ""] if settings else []
        return [f"### {_md(title)}", "", f"From `{_md(source)}`.", "", *same, _md_table(table), ""]
    links = [f"- [{_md(read_view_meta(f)['document'])}](views/{urllib.parse.quote(f.name)})" for f in block[1]]
    return ["### Token pages (fi view): each prefix token shaded by its estimated FI", "", *links, ""]


def _write_markdown(runs, figs, out_dir: Path, cross: pd.DataFrame | None = None) -> list[Path]:
    """report.md and its figure files (listed after it)."""
    parts, pngs = ["# Forward Influence report", ""], []
    for run in runs:
        for block in _blocks(run, figs.get(run["label"], [])):
            parts += _md_block(block, run, out_dir, pngs)
        parts += [f"Full tables: {_md(run['path'])} (CSV), and tables/, report.json here.", ""]
    if cross is not None:
        parts += [f"## {_md(CROSS_TITLE)}", "", _md_table(display_table(text_cells(cross))), ""]
    path = out_dir / "report.md"
    results.atomic_write_text(path, "\n".join(parts))
    return [path] + pngs


def _html_block(block: tuple) -> str:
    e, kind = html.escape, block[0]
    if kind == "h2":
        return f"<h2>{e(block[1])}</h2>"
    if kind == "caption":
        return f"<p class='cap'>{e(block[1])}</p>"
    if kind == "lead":
        lead: LeadTable = block[1]
        note = f"<p class='note'>{e(lead.note)}</p>" if lead.note else ""
        return f"<section class='lead'><h3>Result: {e(lead.title)}</h3>{_html_table(lead.table)}{note}</section>"
    if kind == "list":
        return "<ul class='headline'>" + "".join(f"<li>{e(line)}</li>" for line in block[1]) + "</ul>"
    if kind == "figure":
        _, name, title, png = block
        return (
            f"<figure><img alt='{e(title)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'/>"
            f"<figcaption>{e(title)}</figcaption></figure>"
        )
    if kind == "table":
        _, title, source, table, settings = block
        same = (
            "<p class='settings'><b>Same in every row:</b> "
            + "; ".join(f"{e(names)}: <b>{e(value)}</b>" for names, value in settings)
            + "</p>"
            if settings
            else ""
        )
        return f"<h3>{e(title)} <span class='src'>{e(source)}</span></h3>{same}{_html_table(table)}"
    links = "".join(
        f"<li><a href='views/{e(urllib.parse.quote(f.name))}'>{e(read_view_meta(f)['document'])}</a></li>"
        for f in block[1]
    )
    return f"<h3>Token pages (fi view): each prefix token shaded by its estimated FI</h3><ul>{links}</ul>"


def _write_html(runs, figs, out_dir: Path, cross: pd.DataFrame | None = None) -> Path:
    e = html.escape
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Forward Influence report</title>"
        f"<style>{CSS}</style></head><body><h1>Forward Influence report</h1>"
    ]
    for run in runs:
        parts += [_html_block(block) for block in _blocks(run, figs.get(run["label"], []))]
    if cross is not None:
        parts.append(f"<h2>{e(CROSS_TITLE)}</h2>{_html_table(display_table(text_cells(cross)))}")
    parts.append("</body></html>")
    path = out_dir / "report.html"
    results.atomic_write_text(path, "\n".join(parts))
    return path
