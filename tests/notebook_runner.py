"""Execute a notebook of notebooks/ afresh (shared by the notebook tests)."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, tmp_path: Path, monkeypatch=None, env: dict | None = None, timeout: int = 600):
    """Run ``notebooks/<name>`` in ``tmp_path`` (the kernel inherits ``env``) -> (code-cell outputs,
    printed text); a failing cell raises. Every notebook draws figures inline (PNG outputs), in the
    run and in the committed copy, so a reader sees them without running anything."""
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    print(f"{name} executed in {time.perf_counter() - t0:.0f} s")
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert figures(nb) >= 1, f"{name} drew no inline figure"
    assert figures(nbformat.read(NOTEBOOKS / name, as_version=4)) >= 1, f"the committed {name} holds no figure"
    return outputs, printed


def figures(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
