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
from fi_toolkit.report.display import display_table, split_settings, text_cells
from fi_toolkit.report.figures import plt
from fi_toolkit.report.kinds import KINDS, LeadTable, kind_of, manifest_kind, reads_manifest
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


def _check_manifest(manifest, manifest_file: Path) -> str:
    """The fields a report reads: a dict with 'command' and 'settings' (documents, chunks); -> the run's kind
    (:func:`~fi_toolkit.report.kinds.manifest_kind`)."""
    if not isinstance(manifest, dict):
        raise FIError(f"'{manifest_file}' is not a run manifest (expected a JSON object)")
    command = manifest.get("command")
    top = next((k.top_level_settings for k in KINDS.values() if k.command == command and k.top_level_settings), ())
    if top and "settings" not in manifest:  # a manifest that keeps its settings at the top (fi probe's)
        manifest["settings"] = {k: manifest[k] for k in top if k in manifest}
    if command is None:
        raise FIError(f"'{manifest_file}' lacks the field 'command'; is it a fi correlate/nearfar manifest?")
    settings = manifest.get("settings")
    kind = manifest_kind(command, settings)
    if not reads_manifest(kind):
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
    for own in KINDS.values():  # output of its own (lm-eval's, fi lm-eval): tables computed from its files
        if own.reads_directory is not None and own.reads_directory(path):
            return own.load(path)
    if not manifest_file.is_file():
        raise not_a_run(path)
    try:
        manifest = json.loads(manifest_file.read_text())
    except (ValueError, OSError):
        raise FIError(f"'{manifest_file}' is not valid JSON") from None
    kind = _check_manifest(manifest, manifest_file)
    tables, text = {}, {}
    names = kind_of(kind).tables + [t for t in kind_of(kind).optional_tables if (path / f"{t[0]}.csv").exists()]
    for name, _shown in names:
        f = path / f"{name}.csv"
        if not f.exists():
            raise FIError(f"'{path}' lacks {name}.csv; was the run interrupted? finish it by resuming it")
        try:
            tables[name] = read_table(f)
            text[name] = pd.read_csv(f, dtype=str, keep_default_na=False)
        except (ValueError, pd.errors.ParserError):  # EmptyDataError is a ValueError
            raise FIError(f"'{f}' is not a readable CSV table") from None
    derived = kind_of(kind).derived(tables)
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


def _views(path: Path, manifest: dict) -> list[Path]:
    """The ``fi view`` pages in a run directory (``*.html`` or ``views/*.html``) of the documents it covers."""
    names = {d["name"] for d in manifest["settings"].get("documents", [])}
    found = sorted(path.glob("*.html")) + sorted((path / "views").glob("*.html"))
    return [f for f in found if (meta := read_view_meta(f)) is not None and meta["document"] in names]


def _figures(run: dict) -> list[tuple[str, object]]:
    """The run's figures (its kind's), those with something to draw."""
    made = kind_of(run["kind"]).figures(run["tables"], _caption(run))
    return [(name, fig) for name, fig in made if fig is not None]


def _caption(run: dict) -> str:
    return kind_of(run["kind"]).caption(run)


def cross_run_tables(runs: list[dict]) -> pd.DataFrame | None:
    """With a run of mean replay KL (``fi eval`` text) and runs of accuracy (``fi eval`` tasks, lm-eval): does mean
    replay KL predict accuracy across (policy, budget)? One part per kind of accuracy, in :data:`KINDS` order."""
    replays = [r["tables"][kind_of(r["kind"]).replay_table] for r in runs if kind_of(r["kind"]).replay_table]
    against = [
        (kind, [r["tables"] for r in runs if r["kind"] == kind.name])
        for kind in KINDS.values()
        if kind.versus_replay is not None
    ]
    against = [(kind, tables) for kind, tables in against if tables]
    if not replays or not against:
        return None
    replay = pd.concat(replays, ignore_index=True)
    return pd.concat([kind.versus_replay(tables, replay) for kind, tables in against], ignore_index=True)


def _figure_title(fig, name: str) -> str:
    """What a figure shows: its suptitle (which names the quantities and their units), else its name."""
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    return title or name.replace("_", " ")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")  # legends outside the axes stay in
    plt.close(fig)
    return buf.getvalue()


def _json_value(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: _json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _shown(run: dict, name: str) -> pd.DataFrame:
    """The table as shown: its CSV text in :func:`~fi_toolkit.report.display.display_table`'s reading form,
    its kind's ``shown_columns`` first (the others follow, unless the kind names them all; chunk bounds the chunk
    label already says are left out), its kind's ``shown_rows``."""
    kind = kind_of(run["kind"])
    df = run["text"][name]
    first = [c for c in kind.shown_columns.get(name, []) if c in df.columns]
    derived = {"chunk_start", "chunk_end"} if "chunk" in df.columns else set()
    rest = [c for c in df.columns if c not in first and c not in derived and name not in kind.shown_columns]
    if name in kind.shown_rows:
        df = kind.shown_rows[name](df)
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


def _blocks(run: dict, figs: list[tuple[str, str, bytes]]) -> list[tuple]:
    """What a run's part of the report says, in order, for both writers: its answer first (the lead table and
    the headline), then the figures, then the detail tables, each titled by what it shows."""
    kind = kind_of(run["kind"])
    blocks: list[tuple] = [("h2", f"{kind.title}: {run['label']}"), ("caption", _caption(run))]
    lead = kind.lead(run)
    if lead is not None:
        blocks.append(("lead", lead))
    blocks.append(("list", kind.headline(run["tables"])))
    blocks += [("figure", name, fig_title, png) for name, fig_title, png in figs]
    for name, shown in run["names"]:
        if shown:
            table, settings = split_settings(_shown(run, name))
            blocks.append(("table", kind.table_titles.get(name, name), f"{name}.csv", table, settings))
    for title, source, shown in kind.extra_tables(run):
        table, settings = split_settings(shown)
        blocks.append(("table", title, source, table, settings))
    if run.get("view_copies"):
        blocks.append(("views", run["view_copies"]))
    return blocks


def _settings_text(settings: list[tuple[str, str]]) -> str:
    return "; ".join(f"{names}: {value}" for names, value in settings)


def _md_lead(lead: LeadTable) -> list[str]:
    note = [f"*{_md(lead.note)}*", ""] if lead.note else []
    return [f"### Result: {_md(lead.title)}", "", _md_table(lead.table), "", *note]


def _md_figure(name: str, title: str, png: bytes, run: dict, out_dir: Path, pngs: list[Path]) -> list[str]:
    """The figure's PNG written beside report.md (listed in ``pngs``), and its link."""
    f = out_dir / "figures" / f"{run['label']}__{name}.png"
    results.atomic_write_bytes(f, png)
    pngs.append(f)
    return [f"![{_md(title)}](figures/{urllib.parse.quote(f.name)})", "", f"*Figure: {_md(title)}*", ""]


def _md_detail(title: str, source: str, table: pd.DataFrame, settings: list[tuple[str, str]]) -> list[str]:
    same = [f"*Same in every row:* {_md(_settings_text(settings))}", ""] if settings else []
    return [f"### {_md(title)}", "", f"From `{_md(source)}`.", "", *same, _md_table(table), ""]


def _md_views(pages: list[Path]) -> list[str]:
    links = [f"- [{_md(read_view_meta(f)['document'])}](views/{urllib.parse.quote(f.name)})" for f in pages]
    return ["### Token pages (fi view): each prefix token shaded by its estimated FI", "", *links, ""]


MD_BLOCKS = {  # a block of _blocks -> its Markdown lines; a figure's are _md_figure's, which writes its PNG too
    "h2": lambda text: [f"## {_md(text)}", ""],
    "caption": lambda text: [_md(text), ""],
    "lead": _md_lead,
    "list": lambda lines: [f"- {_md(line)}" for line in lines] + [""],
    "table": _md_detail,
    "views": _md_views,
}


def _md_block(block: tuple, run: dict, out_dir: Path, pngs: list[Path]) -> list[str]:
    what, *fields = block
    return _md_figure(*fields, run, out_dir, pngs) if what == "figure" else MD_BLOCKS[what](*fields)


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


def _html_lead(lead: LeadTable) -> str:
    note = f"<p class='note'>{html.escape(lead.note)}</p>" if lead.note else ""
    return f"<section class='lead'><h3>Result: {html.escape(lead.title)}</h3>{_html_table(lead.table)}{note}</section>"


def _html_figure(name: str, title: str, png: bytes) -> str:
    e = html.escape
    return (
        f"<figure><img alt='{e(title)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'/>"
        f"<figcaption>{e(title)}</figcaption></figure>"
    )


def _html_detail(title: str, source: str, table: pd.DataFrame, settings: list[tuple[str, str]]) -> str:
    e = html.escape
    same = (
        "<p class='settings'><b>Same in every row:</b> "
        + "; ".join(f"{e(names)}: <b>{e(value)}</b>" for names, value in settings)
        + "</p>"
        if settings
        else ""
    )
    return f"<h3>{e(title)} <span class='src'>{e(source)}</span></h3>{same}{_html_table(table)}"


def _html_views(pages: list[Path]) -> str:
    e = html.escape
    links = "".join(
        f"<li><a href='views/{e(urllib.parse.quote(f.name))}'>{e(read_view_meta(f)['document'])}</a></li>"
        for f in pages
    )
    return f"<h3>Token pages (fi view): each prefix token shaded by its estimated FI</h3><ul>{links}</ul>"


HTML_BLOCKS = {  # a block of _blocks -> its HTML
    "h2": lambda text: f"<h2>{html.escape(text)}</h2>",
    "caption": lambda text: f"<p class='cap'>{html.escape(text)}</p>",
    "lead": _html_lead,
    "list": lambda lines: "<ul class='headline'>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>",
    "figure": _html_figure,
    "table": _html_detail,
    "views": _html_views,
}


def _html_block(block: tuple) -> str:
    what, *fields = block
    return HTML_BLOCKS[what](*fields)


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
