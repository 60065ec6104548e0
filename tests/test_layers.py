"""The package's rooms and their layers: no module imports from a higher layer, and no import cycle.

Imports are read from the source (module level and inside functions alike), so a function-level import
that closes a circle fails here too. The layers are declared once, below; docs/architecture.md shows them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from package_graph import PACKAGE, all_modules, import_graph, imports_of, module_name

# Lowest first. A module may import modules of its own layer or a lower one, never a higher one.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "lazy"),  # FIError, the one exception users see; names imported on first use
    ("budget", "eviction", "documents", "intervals", "runs"),  # shared vocabulary; result directories and sharding
    ("model",),  # loading, architectures, attention functions, precision
    ("signals",),  # H, A, D, E, S: formulas, the prefill trace, the tracker
    ("policies",),  # one dataclass per policy behind Policy.keep_map
    ("integrations",),  # kvpress presses as policies, policies as presses
    ("probe",),  # chunks, KL, Forward Influence, noise floor, selections
    ("compress",),  # compressed decoding, generation, replay
    ("studies",),  # correlation, near/far, agreement, statistics
    ("fit",),  # fi fit-data, fi fit: the fitted and learned policies' training (the surrogate's labels use its rows)
    ("surrogate",),  # the FI-trained surrogate: its corpus and label factory
    ("evaluation",),  # fi eval: replays, tasks, summaries
    ("field",),  # fi field: every policy and press against the FI oracle (prefill FI, replay KL, tasks)
    ("report",),  # tables and figures -> HTML, Markdown, CSV, JSON
    ("cli",),  # the fi command line
    ("__init__", "__main__"),  # the public API and `python -m fi_toolkit`
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def room(module: str) -> str:
    """``fi_toolkit.probe.kl`` -> ``probe``; the package root -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_room_is_declared():
    rooms = {room(m) for m in all_modules()}
    assert rooms - set(LAYER_OF) == set(), "declare the new room in LAYERS"


def test_no_module_imports_from_a_higher_layer():
    upward = [
        f"{m} ({room(m)}) imports {t} ({room(t)})"
        for m, targets in import_graph().items()
        for t in sorted(targets)
        if LAYER_OF[room(t)] > LAYER_OF[room(m)]
    ]
    assert upward == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the module graph, or None (iterative three-colour depth-first search)."""
    colour = dict.fromkeys(graph, 0)
    for start in graph:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child) :] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_no_import_cycle():
    graph = import_graph()
    graph.pop("fi_toolkit", None)  # the root re-exports; submodules never import it (checked above)
    assert find_cycle(graph) is None


@pytest.mark.parametrize(
    "graph, cycle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, False),  # a diamond is no cycle
    ],
)
def test_cycle_finder_finds_cycles(graph, cycle):
    assert (find_cycle(graph) is not None) == cycle


def test_relative_imports_are_resolved(tmp_path):
    """The walker sees a function-level relative import, so a hidden circle cannot slip past it."""
    src = PACKAGE / "studies" / "correlation.py"
    module = module_name(src)
    fake = tmp_path / "mod.py"
    fake.write_text("def f():\n    from ..probe import forward_influence\n")
    found = imports_of(fake, module, set(all_modules()))
    assert "fi_toolkit.probe.forward_influence" in found


def test_test_files_share_helpers_only_through_shared_modules():
    """Tests import the shared oracles (tests/oracles.py), cases (tests/cases.py) and runners, never
    another test file: a helper moved or renamed in one test file cannot silently break another."""
    tests_dir = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            offenders += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert offenders == []
