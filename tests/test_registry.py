"""The policy registry (fi_toolkit/policies/registry.py): what it holds against the policy classes themselves,
a policy added in one line, providers found by entry point (the in-tree fallback, a broken provider, a
package's own), and the help texts and errors listing what it holds. No model: fast."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import ClassVar

import pytest

from fi_toolkit.errors import FIError
from fi_toolkit.policies import InfoKV, Policy, SnapKV, registry
from fi_toolkit.policies.registry import entries, policy_help, register, resolve
from fi_toolkit.probe.selections import parse_selection

PROJECT = [
    "infokv",
    "snapkv",
    "pyramidkv",
    "streaming",
    "h2o",
    "knorm",
    "random",
    "rpc",
    "expected_attention",
    "tova",
]  # the order tables use


def test_entries_hold_every_policy_with_its_kind_and_the_defaults_its_class_has():
    """Names, kinds and order as the project has always listed them; each option's default equals the field
    of an instance built with no options (the class decides, not the registry)."""
    held = {e.name: e for e in entries()}
    assert [e.name for e in entries() if e.kind == "policy"] == PROJECT
    assert (held["adaptive"].kind, held["fi-oracle"].kind, held["fitted"].kind) == ("wrapper", "oracle", "file policy")
    assert held["kvpress:NAME"].kind == "press" and held["kvpress:NAME"].cls is None
    for e in entries():
        if e.kind in ("policy", "oracle"):
            default = e.cls()
            assert {o.name: o.default for o in e.options} == {o.name: getattr(default, o.name) for o in e.options}
            fields = {f.name for f in dataclasses.fields(e.cls) if f.init} - {"budget"}
            assert {o.name for o in e.options} == fields, e.name
    assert [(o.name, o.type) for o in held["infokv"].options] == [
        ("window", "int"),
        ("alpha", "float"),
        ("tau", "float"),
        ("top_k", "int"),
    ]


@dataclass
class Newest(Policy):
    """A policy written for the test: keeps the most recent entries (scores are the positions)."""

    bias: float = 0.0

    name: ClassVar[str] = "newest-test"
    needs_signals: ClassVar[bool] = False

    def scores(self, s, layer):
        return s.positions[layer].float() + self.bias


@pytest.fixture
def newest(monkeypatch):
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))  # registered for this test only
    register(Newest, summary="the most recent entries")
    return Newest


def test_a_policy_registered_in_one_line_is_named_everywhere(newest, tiny, tiny_ids):
    from fi_toolkit.signals.config import SignalConfig
    from fi_toolkit.signals.trace import trace_prefix

    policy = resolve("newest-test:bias=1", "keep=0.5", 8)
    assert policy == Newest(budget="keep=0.5", window=8, bias=1.0) and policy.label == "newest-test:bias=1.0@keep=0.5"
    assert "newest-test (bias=0.0)" in policy_help()
    (sel,) = parse_selection("policy:newest-test@keep=0.5")
    trace = trace_prefix(tiny.model, tiny_ids, 64, SignalConfig(window=8))
    kept = sel.resolve(trace).keep[0]
    assert kept.tolist() == [list(range(32, 64))] * kept.shape[0]  # the newest 32 of 64, per head
    with pytest.raises(ValueError, match="registered already"):
        register(Newest, summary="twice")
    with pytest.raises(FIError, match="newest-test has no option 'alpha'"):
        resolve("newest-test:alpha=1")


def test_unknown_names_are_one_line_that_lists_the_registered_names():
    for text in ("magic", "lru:alpha=1", "adaptive(magic)"):
        with pytest.raises(FIError) as exc:
            resolve(text, "keep=0.5")
        message = str(exc.value)
        assert "\n" not in message and "unknown policy" in message
        assert all(e.name in message for e in entries() if e.kind not in ("wrapper", "oracle")), message
        assert "adaptive(NAME)" in message
        assert "fi-oracle" not in message  # where no future is known, an oracle is no choice
        with pytest.raises(FIError, match="fi-oracle") as exc:  # where it is (a probe, fi eval on documents)
            resolve(text, "keep=0.5", future=True)
        assert all(e.name in str(exc.value) for e in entries() if e.kind != "wrapper")


def test_help_texts_list_what_the_registry_holds():
    """policy_help is built from entries(): every name (oracles only where asked), with its options' defaults;
    each command's help carries it."""
    import typer

    from fi_toolkit.cli.app import app

    for oracles in (True, False):
        text = policy_help(oracles=oracles)
        for e in entries():
            shown = e.spelling.replace("[:key=value,...]", "")
            assert (shown in text) == (oracles or e.kind != "oracle"), (shown, oracles)
    assert "infokv (alpha=0.9, tau=1.0, top_k=256)" in policy_help() and "pyramidkv (beta=20.0)" in policy_help()
    assert "kvpress:NAME@B" in policy_help(selection=True) and "fi-oracle@B" in policy_help(selection=True)
    root = typer.main.get_command(app)
    helps = {  # by the option's flag (its parameter is the settings field's generated name)
        (cmd, flag[2:]): p.help
        for cmd in ("eval", "generate", "view", "probe")
        for p in root.commands[cmd].params
        for flag in getattr(p, "opts", [])
        if flag.startswith("--")
    }
    assert policy_help() in helps["eval", "policy"]
    assert (
        policy_help(oracles=False) in helps["generate", "policy"]
        and policy_help(oracles=False) in helps["view", "policy"]
    )
    assert policy_help(selection=True) in helps["probe", "select"]


# --- providers ----------------------------------------------------------------------------------------------

TOY = """
from dataclasses import dataclass
from fi_toolkit.policies import SnapKV
from fi_toolkit.policies.registry import Entry

@dataclass(frozen=True)
class Chosen:
    label: str
    def n_kept(self, p):
        return p // 2
    def keep_map(self, model, ids, p, where):
        raise NotImplementedError

class Toy:
    prefix = "toy"
    def entries(self):
        return [Entry("toy:NAME", "press", "a toy family", spelling="toy:NAME", selection="toy:NAME@B")]
    def resolve(self, text, budget, window, where):
        policy = SnapKV(budget=budget, window=window or 32)
        policy.name = text.strip()
        return policy
    def selection(self, text, where):
        return Chosen(text.strip())

PROVIDER = Toy()
"""


@pytest.fixture
def providers(monkeypatch, tmp_path):
    """Entry points of the group as the test says (``{prefix: "module:object"}``), a toy provider importable as
    ``toy_provider``; the registry's discovery cache is cleared before and after."""
    (tmp_path / "toy_provider.py").write_text(TOY)
    (tmp_path / "broken_provider.py").write_text("raise ImportError('needs a library that is not installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(points: dict[str, str]):
        found = [EntryPoint(name, value, registry.ENTRY_POINT_GROUP) for name, value in points.items()]
        monkeypatch.setattr("importlib.metadata.entry_points", lambda group=None: found if group else [])
        registry._providers.cache_clear()

    yield install
    registry._providers.cache_clear()


def test_a_package_adds_a_family_through_an_entry_point(providers):
    providers({"toy": "toy_provider:PROVIDER"})
    assert registry.prefixes() == ("kvpress", "toy")  # the in-tree kvpress provider, not named by an entry point
    assert "toy:NAME" in [e.name for e in entries()] and "toy:NAME: a toy family" in policy_help()
    policy = resolve("toy:Anything", "keep=0.5", 8)
    assert isinstance(policy, SnapKV) and policy.name == "toy:Anything" and policy.window == 8
    assert resolve("infokv", "keep=0.5") == InfoKV(budget="keep=0.5")  # project names never reach a provider
    (sel,) = parse_selection("toy:Anything@0.5", "--select")
    assert sel.kind == "toy" and sel.label == "toy:Anything@0.5" and sel.check(100, 8, 4) == 50
    with pytest.raises(FIError, match="unknown selector 'other'.*policy, kvpress, toy"):
        parse_selection("other:x@0.5")


def test_the_in_tree_provider_is_found_without_an_entry_point_and_an_entry_point_wins(providers):
    providers({})  # an install whose metadata predates the group (the shared development venv)
    assert registry.prefixes() == ("kvpress",)
    assert registry._providers()[0]["kvpress"].__class__.__name__ == "KvpressProvider"
    providers({"kvpress": "toy_provider:PROVIDER"})  # an entry point of that name replaces the in-tree one
    assert resolve("kvpress:X", "keep=0.5").name == "kvpress:X"


def test_a_broken_provider_answers_in_one_line_and_breaks_nothing_else(providers):
    providers({"broken": "broken_provider:PROVIDER"})
    assert resolve("snapkv", "keep=0.5") == SnapKV(budget="keep=0.5")
    assert "kvpress:NAME" in [e.name for e in entries()]
    with pytest.raises(FIError) as exc:
        resolve("broken:X", "keep=0.5", where="--policy broken:X")
    assert str(exc.value) == (
        "--policy broken:X: the policies under 'broken:' cannot be loaded "
        "(ImportError: needs a library that is not installed)"
    )


def test_naming_a_project_policy_imports_no_torch_and_reads_no_entry_points():
    """In a fresh interpreter: resolving project names loads neither torch nor importlib.metadata (the provider
    scan); naming a prefix reads the entry points."""
    code = textwrap.dedent("""
        import json, sys
        from fi_toolkit.policies.registry import resolve
        resolve("infokv:alpha=0.5", "keep=0.25", 32); resolve("adaptive(snapkv)", 0.3)
        before = [m for m in ("torch", "importlib.metadata") if m in sys.modules]
        from fi_toolkit.policies.registry import prefixes
        prefixes()
        print(json.dumps([before, "importlib.metadata" in sys.modules, "torch" in sys.modules]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[], True, False]
