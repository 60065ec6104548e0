"""One run of a resumable command, start to finish: :func:`execute_run` computes every unit not yet
finished (:class:`~fi_toolkit.runs.resumable.ResumableRun`), writes the summaries, then the manifest
(:func:`run_manifest`), and swaps a staged ``--overwrite`` in. Every command that writes a resumable run
directory (``fi correlate``, ``fi nearfar``, ``fi eval``, ``fi field``, ``fi labels``) ends here, so their
manifests share one shape: command, settings, model, versions, timing, and who computed each unit.
"""

from __future__ import annotations

import time
from typing import Callable

from fi_toolkit.runs import results
from fi_toolkit.runs.resumable import ResumableRun, document_keys


def run_manifest(lm, run: ResumableRun, started: str, seconds: float, keys: list[str], extra: dict) -> dict:
    """``manifest.json`` of a finished run: its command and settings, the model and versions, ``extra`` (the
    command's own: a noise floor, a corpus), its timing and the units (who computed each, in which session)."""
    units = run.units(keys)
    return {
        "command": run.command,
        "started": started,
        "finished": results.now(),
        "seconds": round(seconds, 2),
        "settings": run.settings,
        "computed_this_session": [u["document"] for u in units if u.get("session") == run.session],
        "model": lm.describe(),
        "versions": results.versions(),
        **extra,
        "world_size": run.world.size,
        "timing": run.timing,
        "units": units,
        "unit_log": run.unit_log(),
    }


def execute_run(
    lm,
    run: ResumableRun,
    units,
    compute,
    summaries: Callable[[dict], dict],
    extra: Callable[[dict], dict],
    costs=None,
    assemble=None,
    merge: bool = True,
) -> dict | None:
    """Run every unit (document or task sample), write the summaries, then the manifest with
    ``extra(tables)`` in it (the studies: each document's noise floor).

    Under torchrun the units are shared among the ranks (``costs`` balance them, default token counts);
    rank 0 writes the summaries and the manifest and returns the tables, the other ranks None.
    ``assemble(doc, parts)``: the units are parts of documents, joined per document at the merge.
    ``merge=False``: the units' own tables are the result (no combined tables; ``summaries`` gets ``{}``).
    """
    started, t0 = results.now(), time.perf_counter()
    tables = run.run(units, compute, costs=costs, assemble=assemble, merge=merge)
    if tables is None:  # not rank 0 of a sharded run: its units are saved, rank 0 merges
        return None
    t1 = time.perf_counter()
    for name, table in summaries(tables).items():
        results.write_table(run.path / f"{name}.csv", table)
        tables[name] = table
    run.timing["summaries_s"] = round(time.perf_counter() - t1, 3)
    keys = document_keys([u.name for u in units])
    results.write_json(
        run.path / "manifest.json", run_manifest(lm, run, started, time.perf_counter() - t0, keys, extra(tables))
    )
    run.finish()  # --overwrite: the new run, complete, replaces the old one only now
    return tables
