"""One method spec (fi_toolkit/policies/method.py): ``NAME[@BUDGET][:key=value,...]`` parses into one ``Method``
whatever NAME is, every command takes the same strings, the first spellings give the same methods, labels and
tables, and a press's bare budget is refused naming the fix.

The oracles share no code with the parser: a policy built from its class by hand (``SnapKV(budget=..., window=...)``),
a token set ranked by hand from the trace's signal, and the tables of runs made with the first spellings.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from cli_runner import run_cli

from fi_toolkit.budget import Budget
from fi_toolkit.compress.generate_settings import GenerateSettings
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.arguments import policy_from_spec
from fi_toolkit.evaluation.settings import make_policies
from fi_toolkit.field.settings import FieldSettings
from fi_toolkit.field.spec import parse_budgets, parse_methods, replay_policy
from fi_toolkit.policies import H2O, InfoKV, SnapKV
from fi_toolkit.policies.method import POLICY, PRESS, SET
from fi_toolkit.policies.registry import parse_method, resolve
from fi_toolkit.probe.selections import parse_selection, parse_selections
from fi_toolkit.runs.resumable import read_table
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.signals.trace import trace_prefix

HAS_KVPRESS = importlib.util.find_spec("kvpress") is not None
KEEP = Budget("keep", 0.25)


@pytest.mark.parametrize(
    "text, kind, head, budget, options",
    [
        ("snapkv", POLICY, "snapkv", None, ""),
        ("snapkv@keep=0.25", POLICY, "snapkv", KEEP, ""),
        ("infokv@0.25:alpha=0.5,tau=2", POLICY, "infokv", KEEP, "alpha=0.5,tau=2.0"),
        ("adaptive(infokv)@remove=10", POLICY, "infokv-adaptive", Budget("remove", 10), ""),
        ("fi-oracle@keep=0.25:chunk=512:640,rounds=2", POLICY, "fi-oracle", KEEP, "chunk=512:640,rounds=2"),
        ("surrogate@keep=0.25:path=runs/a@b", POLICY, "surrogate", KEEP, "path=runs/a@b"),
        ("kvpress:SnapKVPress@keep=0.25", PRESS, "kvpress:SnapKVPress", KEEP, ""),
        (
            "kvpress:AdaKVPress/SnapKVPress:window_size=32",
            PRESS,
            "kvpress:AdaKVPress/SnapKVPress",
            None,
            "window_size=32",
        ),
        ("set:entropy@remove=0.1", SET, "entropy", Budget("remove", 0.1), ""),
        ("attention@remove=0.1", SET, "attention", Budget("remove", 0.1), ""),  # no policy has the name
        ("set:infokv@remove=0.1", SET, "infokv", Budget("remove", 0.1), ""),  # infokv alone is the policy
        ("set:random@remove=0.1:seeds=0-4", SET, "random", Budget("remove", 0.1), "seeds=0-4"),
        ("set:positions:at=10-20,35", SET, "positions", None, "at=10-20,35"),
    ],
)
def test_every_kind_parses_into_one_method_whose_spelling_parses_back(text, kind, head, budget, options):
    method = parse_method(text)
    assert (method.kind, method.head, method.budget, method.options) == (kind, head, budget, options)
    assert parse_method(method.spelling) == method


def test_the_first_spellings_are_the_same_methods_and_labels():
    assert parse_method("policy:infokv@0.25:alpha=0.5") == parse_method("infokv@keep=0.25:alpha=0.50")
    assert parse_method("adaptive(infokv)@0.1") == parse_method("infokv-adaptive@keep=0.1")
    pairs = [
        ("policy:snapkv@keep=0.25", "snapkv@keep=0.25"),
        ("policy:adaptive(infokv)@0.25:alpha=0.5", "infokv-adaptive@keep=0.25:alpha=0.5"),
        ("entropy:remove=0.1", "set:entropy@remove=0.1"),
        ("infokv:0.1", "set:infokv@keep=0.1"),
        ("random:remove=0.1@2-3", "set:random@remove=0.1:seeds=2-3"),
        ("random:remove=0.1", "set:random@remove=0.1"),
        ("positions:10-20,35", "set:positions:at=10-20,35"),
    ]
    for old, new in pairs:
        before, after = parse_selection(old), parse_selection(new)
        assert [s.label for s in before] == [s.label for s in after], (old, new)
        assert [s.method for s in before] == [s.method for s in after]
    assert [s.label for s in parse_selection("random:remove=0.1@2-3")] == ["random:remove=0.1@2", "random:remove=0.1@3"]
    assert parse_selection("snapkv@keep=0.25")[0].label == "policy:snapkv@keep=0.25"  # the tables' label


def test_one_string_gives_the_policy_built_by_hand_in_every_command():
    """``infokv@keep=0.25:alpha=0.3,tau=2`` in ``--select``, ``fi eval --policy``, ``fi field --policy``,
    ``fi generate --policy`` and lm-eval's ``policy=``: the InfoKV its class builds with those fields."""
    text, config = "infokv@keep=0.25:alpha=0.3,tau=2", SignalConfig(window=32, top_k=10)
    want = InfoKV(budget=KEEP, window=32, alpha=0.3, tau=2.0, top_k=10)
    (selection,) = parse_selection(text)
    built = [
        selection.make_policy(32, alpha=0.9, tau=0.1, top_k=10),  # the trace's defaults lose to the spelled options
        *make_policies(text, "keep=0.1,keep=0.5", 32, 0.9, 0.1, 10),  # its own budget, not every --budget
        replay_policy(parse_methods([text], [KEEP])[0], KEEP, config),
        GenerateSettings(policy=text, budget="keep=0.5", signals=config).make_policy(),
        policy_from_spec(text, "keep=0.5", 32, {"top_k": 10}),
    ]
    for policy in built:
        assert type(policy) is InfoKV and policy.budget == KEEP
        assert (policy.window, policy.alpha, policy.tau, policy.top_k) == (32, 0.3, 2.0, 10)
    assert repr(built[1]) == repr(want)  # every field, the defaults not spelled included
    assert GenerateSettings(policy=text, budget="keep=0.5", signals=config).budget == KEEP  # the run says which


def test_a_name_with_its_own_budget_runs_at_that_budget_alone():
    runs = make_policies("snapkv@keep=0.25,h2o", "keep=0.1,keep=0.5", 32, 0.5, 1.0, 10)
    assert [(type(p), p.budget.label) for p in runs] == [
        (SnapKV, "keep=0.25"),
        (H2O, "keep=0.1"),
        (H2O, "keep=0.5"),
    ]
    with pytest.raises(FIError, match="'snapkv@keep=0.5' and 'snapkv' are the same policy .* at keep=0.5"):
        make_policies("snapkv@keep=0.5,snapkv", "keep=0.1,keep=0.5", 32, 0.5, 1.0, 10)
    budgets = parse_budgets(["keep=0.25", "keep=0.5"])
    (m,) = parse_methods(["snapkv@remove=0.75"], budgets)  # keep=0.25 spelled by what it removes
    assert [b.label for b in budgets if m.runs_at(b)] == ["keep=0.25"]
    with pytest.raises(FIError, match=r"its budget keep=0.3 is none of the map's \(keep=0.25, keep=0.5\)"):
        parse_methods(["snapkv@keep=0.3"], budgets)
    with pytest.raises(FIError, match="gives 'snapkv@keep=0.5' twice"):
        parse_methods(["snapkv", "snapkv@keep=0.5"], budgets)
    assert len(parse_methods(["snapkv@keep=0.25", "snapkv@keep=0.5"], budgets)) == 2
    assert FieldSettings(methods=["h2o", "snapkv@keep=0.5"], budgets=["keep=0.25", "keep=0.5"]).methods[1].budget == (
        Budget("keep", 0.5)
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: parse_selection("kvpress:SnapKVPress@0.75", "--select"),
        lambda: make_policies("kvpress:SnapKVPress@0.75", "keep=0.25", 32, 0.5, 1.0, 10),
        lambda: parse_methods(["kvpress:SnapKVPress@0.75"], [KEEP]),
        lambda: resolve("kvpress:SnapKVPress@0.75"),
    ],
)
def test_a_press_with_a_bare_budget_is_refused_everywhere_naming_both_fixes(call):
    with pytest.raises(FIError) as exc:
        call()
    assert "write keep=0.25 or remove=0.75: kvpress's compression_ratio is the share removed" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_press_budget_names_its_side_and_both_sides_are_one_budget():
    keep, remove = parse_method("kvpress:SnapKVPress@keep=0.25"), parse_method("kvpress:SnapKVPress@remove=0.75")
    assert keep.runs_at(remove.budget) and remove.runs_at(keep.budget)
    assert keep.budget.removed_share == remove.budget.removed_share == 0.75


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: make_policies("set:entropy@0.1", "keep=0.25", 32, 0.5, 1.0, 10), "is a token set of the probe's"),
        (lambda: GenerateSettings(policy="attention@remove=0.1"), "is a token set of the probe's"),
        (lambda: parse_methods(["set:random@0.1"], [KEEP]), "a token set is a probe's selection"),
        (lambda: parse_selection("snapkv", "--select"), "a probe selection needs a budget, NAME@BUDGET"),
        (lambda: parse_selection("infokv:alpha=0.5", "--select"), "a probe selection needs a budget"),
        (lambda: parse_method("infokv:alpha=0.5@keep=0.25"), "write the budget before the options: infokv@keep=0.25"),
        (lambda: parse_method("set:entropy@0.1:seeds=1"), "set:entropy has no option 'seeds' (it takes no options)"),
        (lambda: parse_method("set:magic@0.1"), "unknown token set 'magic'"),
        (lambda: parse_selection("magic@0.1", "--select"), "unknown selector 'magic'"),
        (lambda: parse_selections(["policy:h2o@0.5", "h2o@keep=0.5"], "--select"), "select the same set"),
    ],
)
def test_what_a_command_cannot_measure_is_one_line(call, message):
    with pytest.raises(FIError) as exc:
        call()
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_keep_maps_and_token_sets_equal_those_built_by_hand(tiny, tiny_ids):
    """Each spelling's keep map is the one SnapKV's class gives; each spelling of a token set removes the top
    ``n`` entropies of ``[sinks, p - w)``, ranked here by hand."""
    p, w, sinks = 200, 16, 4
    trace = trace_prefix(tiny.model, tiny_ids, p, SignalConfig(window=w))
    want = SnapKV(budget=KEEP, window=w).keep_map(trace).keep
    for spec in ("snapkv@keep=0.25", "policy:snapkv@0.25", "snapkv@remove=150"):
        (sel,) = parse_selection(spec)
        got = sel.resolve(trace, sinks=sinks).keep
        assert all(torch.equal(a, b) for a, b in zip(got, want)), spec
    n = 20  # remove=0.1 of p = 200
    scores = trace.entropy[sinks : p - w]
    by_hand = set((sinks + torch.tensor(sorted(range(len(scores)), key=lambda i: (-scores[i].item(), i))[:n])).tolist())
    for spec in ("entropy:remove=0.1", "set:entropy@remove=0.1", "entropy@remove=20"):
        (sel,) = parse_selection(spec)
        assert set(sel.resolve(trace, sinks=sinks).removed.tolist()) == by_hand, spec


@pytest.mark.smollm
def test_the_first_spellings_and_the_one_spec_give_identical_tables(tmp_path, capsys):
    """On alice, p = 128: ``fi probe`` with the first spellings and with the one spec writes the same FI table bit
    for bit; ``fi eval --policy snapkv@keep=0.5`` replays what ``--policy snapkv --budget keep=0.5`` does; ``fi
    field`` measures ``snapkv@keep=0.5`` at that budget alone, its cells those of the probe."""

    def run(args):
        code, _, err = run_cli(args, capsys)
        assert code == 0, err

    probe = ["probe", "alice", "--prefix", "128", "--chunk", "128:160"]
    old = ["policy:snapkv@keep=0.5", "entropy:remove=0.1", "random:remove=0.1@0-1", "positions:10-20"]
    new = ["snapkv@keep=0.5", "set:entropy@remove=0.1", "set:random@remove=0.1:seeds=0-1", "set:positions:at=10-20"]
    for name, specs in (("old", old), ("new", new)):
        run([*probe, *(a for s in specs for a in ("--select", s)), "--out", str(tmp_path / name)])
    before, after = read_table(tmp_path / "old" / "fi.csv"), read_table(tmp_path / "new" / "fi.csv")
    assert len(before) == 7 and before.to_csv() == after.to_csv()  # and the probe's two controls

    replay = ["eval", "alice", "--prompt", "128", "--length", "192", "--interval", "32", "--free-tokens", "0"]
    replay += ["--resamples", "0"]
    run([*replay, "--policy", "snapkv", "--budget", "keep=0.5", "--out", str(tmp_path / "eval-old")])
    run([*replay, "--policy", "snapkv@keep=0.5", "--budget", "keep=0.1", "--out", str(tmp_path / "eval-new")])
    before, after = read_table(tmp_path / "eval-old" / "replays.csv"), read_table(tmp_path / "eval-new" / "replays.csv")
    assert list(after["budget"]) == ["keep=1", "keep=0.5"]  # the full cache, then snapkv at its own budget alone
    assert before.drop(columns="seconds").to_csv() == after.drop(columns="seconds").to_csv()

    field = ["field", "alice", "--prefix", "128", "--distances", "0", "--chunk-len", "32", "--seeds", "1"]
    field += ["--policy", "snapkv@keep=0.5", "--policy", "h2o", "--budget", "keep=0.5", "--budget", "keep=0.75"]
    run([*field, "--resamples", "0", "--out", str(tmp_path / "field")])
    fi = read_table(tmp_path / "field" / "fi.csv")
    cells = sorted(map(tuple, fi[fi["kind"] == "policy"][["method", "budget"]].to_numpy().tolist()))
    assert cells == [("h2o", "keep=0.5"), ("h2o", "keep=0.75"), ("snapkv", "keep=0.5")]
    mine = fi[fi["method"] == "snapkv"]["fi"].to_numpy()
    theirs = read_table(tmp_path / "old" / "fi.csv").query("selection == 'policy:snapkv@keep=0.5'")["fi"].to_numpy()
    assert mine.tobytes() == theirs.tobytes()
