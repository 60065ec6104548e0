"""``fi fit-surrogate``: train the surrogate on ``fi labels`` runs (:mod:`fi_toolkit.surrogate.train`).

``fi fit-surrogate RUN... --out DIR`` writes kvpress's KVzap format (``config.json``, ``model.safetensors``) that
``surrogate:path=DIR`` reads; its options are generated from
:class:`~fi_toolkit.surrogate.train_settings.SurrogateFitSettings`, the model's and
:class:`~fi_toolkit.runs.settings.OutDirSettings` (``--out``, ``--overwrite``).
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from fi_toolkit.cli.options import _progress, err, out, settings_options, unit_progress
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.runs.settings import OutDirSettings
from fi_toolkit.surrogate.train_settings import SurrogateFitSettings


@settings_options(
    output={
        "out_dir": "Directory for config.json and model.safetensors.",
        "overwrite": "Replace the model already in --out.",
    }
)
def fit_surrogate(
    runs: List[Path] = typer.Argument(..., help="Run directories of fi labels (their units are pooled)."),
    *,
    settings: SurrogateFitSettings = SurrogateFitSettings(),
    model: ModelSettings = ModelSettings(),
    output: OutDirSettings,
):
    """Train KVzap's per-layer scorer of hidden states on Forward Influence labels."""
    from fi_toolkit.runs import results
    from fi_toolkit.surrogate.train import run_fit_surrogate

    model.check()
    settings.check()
    results.check_results_dir(output.out_dir, output.overwrite)
    for run in runs:
        if not run.is_dir():
            raise FIError(f"'{run}' is not a directory of fi labels", parameter="runs")
    lm = model.load()
    with _progress() as bar:
        trained = run_fit_surrogate(lm, runs, settings, output.out_dir, progress=unit_progress(bar, "fit-surrogate"))
    a = trained.about
    out.print(
        f"trained a {settings.form} surrogate ({settings.loss} loss, target {settings.target}) on {a['units']} "
        f"units, {a['labels']:,} labels: {trained.n_modules} layers x {trained.output_dim} KV heads"
    )
    err.print(f"wrote {output.out_dir}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``fit-surrogate`` to ``app``."""
    app.command("fit-surrogate")(fit_surrogate)
