"""Execute a notebook of notebooks/ afresh (shared by the notebook tests), where a reader runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def git_status() -> str | None:
    """``git status --porcelain`` of the checkout holding notebooks/ (untracked files too), or None outside one."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=NOTEBOOKS, capture_output=True, text=True
    )
    return done.stdout if done.returncode == 0 else None


def execute(name: str, tmp_path: Path, monkeypatch=None, env: dict | None = None, timeout: int = 600):
    """Run ``notebooks/<name>`` in notebooks/, as a reader does, with ``FI_NOTEBOOK_OUT=tmp_path`` (where a
    notebook writes its files; the kernel inherits ``env`` too) -> (code-cell outputs, printed text); a failing
    cell raises, and so does a run that changes ``git status`` (a notebook must never write into the repository).
    Every notebook draws figures inline (PNG outputs), in the run and in the committed copy, so a reader sees
    them without running anything."""
    saved = {k: os.environ.get(k) for k in ["FI_NOTEBOOK_OUT", *(env or {})]}
    os.environ.update({"FI_NOTEBOOK_OUT": str(tmp_path), **(env or {})})
    before = git_status()
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    t0 = time.perf_counter()
    try:
        NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
        ).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    print(f"{name} executed in {time.perf_counter() - t0:.0f} s")
    assert git_status() == before, f"running {name} changed the repository:\n{git_status()}"
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert figures(nb) >= 1, f"{name} drew no inline figure"
    assert figures(nbformat.read(NOTEBOOKS / name, as_version=4)) >= 1, f"the committed {name} holds no figure"
    return outputs, printed


def figures(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def committed_text(name: str) -> str:
    """What the committed copy of ``notebooks/<name>`` printed (its code cells' stream outputs), to compare with a
    fresh run."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    return "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "stream"
    )
