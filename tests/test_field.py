"""``fi field``: its cells equal ``fi probe``'s and ``fi eval``'s run separately with the same settings (bit for
bit), its headroom equals the ratio of means computed by hand from its own FI table, a method that cannot run is
listed in refused.csv while the rest completes, one document gives "n/a" intervals, and bad input answers with
one line before the model loads.

The smollm cases keep the map small: p = 128, chunks 128:160 and 192:224, keep 50 % (keep 25 % removes 96 of
the 92 positions the random anchor may draw with a window of 32), replay every 32 tokens up to 224.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pandas as pd
import pytest
from cli_runner import run_cli

from fi_toolkit.field.summary import NEEDS_TWO, NO_INTERVAL, field_summaries
from fi_toolkit.runs.resumable import read_table

HAS_KVPRESS = importlib.util.find_spec("kvpress") is not None
DOCS = ["alice", "hamlet"]
COMMON = ["--prefix", "128"]
ORACLE = ["--oracle", "samples=4"]  # 4 label draws (16 by default): these tests check the tables, not the oracle
FIELD = ["field", *DOCS, "--policy", "snapkv", "--policy", "h2o", *COMMON, "--distances", "0,64", "--chunk-len", "32"]
FIELD += ["--budget", "keep=0.5", "--replay", "--interval", "32", "--resamples", "200", *ORACLE]
NEAR_ORACLE = "policy:fi-oracle@keep=0.5:samples=4,chunk=128:160"  # the field's oracle anchor on the near chunk


@pytest.fixture(scope="module")
def field_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("field") / "run"
    return out


def _run(args, capsys):
    code, stdout, stderr = run_cli(args, capsys)
    assert code == 0, stderr
    return stdout, stderr


@pytest.mark.smollm
def test_field_cells_equal_fi_probe_and_fi_eval_bit_for_bit(tmp_path, capsys):
    _run([*FIELD, "--out", str(tmp_path / "field")], capsys)
    probe = ["probe", *DOCS, *COMMON, "--chunk", "128:160", "--chunk", "192:224"]
    probe += ["--select", "policy:snapkv@keep=0.5", "--select", "policy:h2o@keep=0.5", "--select", NEAR_ORACLE]
    probe += ["--out", str(tmp_path / "probe")]
    _run(probe, capsys)
    evaluate = ["eval", *DOCS, "--policy", "snapkv,h2o", "--budget", "keep=0.5", "--prompt", "128", "--length", "224"]
    evaluate += ["--interval", "32", "--free-tokens", "0", "--resamples", "0", "--out", str(tmp_path / "eval")]
    _run(evaluate, capsys)

    fi = read_table(tmp_path / "field" / "fi.csv")
    fi = fi[fi["kind"] == "policy"]
    ref = read_table(tmp_path / "probe" / "fi.csv")
    ref = ref[ref["selection"].isin(["policy:snapkv@keep=0.5", "policy:h2o@keep=0.5"])]
    mine = fi.set_index(["document", "selection", "chunk"])["fi"].sort_index()
    theirs = ref.set_index(["document", "selection", "chunk"])["fi"].sort_index()
    assert len(mine) == 8 and list(mine.index) == list(theirs.index)
    assert mine.to_numpy().tobytes() == theirs.to_numpy().tobytes()  # bit for bit
    anchor = read_table(tmp_path / "field" / "fi.csv")  # the oracle anchor with --oracle's options: the probe's
    anchor = anchor[anchor["selection"] == NEAR_ORACLE].set_index(["document", "chunk"])["fi"].sort_index()
    probed = read_table(tmp_path / "probe" / "fi.csv")
    probed = probed[probed["selection"] == NEAR_ORACLE].set_index(["document", "chunk"])["fi"].sort_index()
    assert len(anchor) == 4 and list(anchor.index) == list(probed.index)
    assert anchor.to_numpy().tobytes() == probed.to_numpy().tobytes()

    replays = read_table(tmp_path / "field" / "replays.csv")
    mine = replays.set_index(["document", "policy", "budget"])["mean_kl"].sort_index()
    ev = read_table(tmp_path / "eval" / "replays.csv")
    theirs = ev[ev["policy"] != "full"].set_index(["document", "policy", "budget"])["mean_kl"].sort_index()
    assert len(mine) == 4 and list(mine.index) == list(theirs.index)
    assert mine.to_numpy().tobytes() == theirs.to_numpy().tobytes()

    # the headroom, recomputed by hand from the FI table: random seeds averaged per document, the oracle that
    # saw the chunk, then the ratio of means over the documents
    fi = read_table(tmp_path / "field" / "fi.csv")
    hr = read_table(tmp_path / "field" / "headroom.csv")
    for chunk in ("128:160", "192:224"):
        at = fi[fi["chunk"] == chunk]
        rand = at[at["method"] == "random-positions"].groupby("document")["fi"].mean()
        orc = at[at["selection"] == f"policy:fi-oracle@keep=0.5:samples=4,chunk={chunk}"].set_index("document")["fi"]
        for method in ("snapkv", "h2o"):
            pol = at[at["method"] == method].set_index("document")["fi"]
            docs = sorted(DOCS)
            want = (np.mean(rand[docs]) - np.mean(pol[docs])) / (np.mean(rand[docs]) - np.mean(orc[docs]))
            got = hr[(hr["chunk"] == chunk) & (hr["method"] == method)]["headroom"].item()
            assert got == pytest.approx(want, rel=1e-12)
            row = hr[(hr["chunk"] == chunk) & (hr["method"] == method)].iloc[0]
            assert np.isnan(row["ci_low"]) and np.isnan(row["ci_high"])  # two documents: no bootstrap interval
    board = read_table(tmp_path / "field" / "leaderboard.csv")
    assert set(board["method"]) == {"snapkv", "h2o", "random-positions", "fi-oracle"}
    assert (board[board["method"] == "fi-oracle"]["headroom_near"] == 1.0).all()

    # fi report reads the run: its headline names the method with the lowest mean FI (from fi.csv by hand)
    _run(["report", str(tmp_path / "field"), "--out", str(tmp_path / "report")], capsys)
    md = (tmp_path / "report" / "report.md").read_text()
    near = fi[(fi["chunk"] == "128:160") & (fi["kind"] == "policy")].groupby("method")["fi"].mean()
    assert f"keep=0.5, near chunk: lowest FI {near.idxmin()} ({near.min():.3g} nats)" in md
    assert not re.search(r"\bnan\b", md, re.I)
    assert sorted(p.name for p in (tmp_path / "report" / "figures").glob("*.png")) == [
        "field__fi_vs_replay.png",
        "field__field_headroom.png",
    ]


@pytest.mark.smollm
def test_field_resumes_per_cell_and_lists_what_cannot_run(tmp_path, capsys, monkeypatch):
    """One document, the default methods (every project policy; kvpress, missing here, is listed as refused):
    a stopped run resumes computing only the missing cells, and the intervals say why there are none."""
    if HAS_KVPRESS:
        pytest.skip("this case checks the listing of kvpress where it is missing")
    out = tmp_path / "run"
    args = ["field", "alice", *COMMON, "--distances", "0", "--chunk-len", "32", "--budget", "keep=0.5", *ORACLE]
    args += ["--resamples", "50", "--out", str(out)]
    from fi_toolkit.field import run as field_module

    real, calls, stop = field_module.field_cell, [], [True]

    def stop_at_third(*a, **k):
        calls.append(a[3].name)
        if stop[0] and len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(field_module, "field_cell", stop_at_third)
    code, _, _ = run_cli(args, capsys)
    assert code == 130 and len(list(out.glob("per_document/*/done.json"))) == 2
    calls.clear()
    stop[0] = False
    _, stderr = _run([*args, "--resume"], capsys)
    assert "random-positions" not in calls and "fi-oracle" not in calls and len(calls) == 10  # 12 cells, 2 done
    refused = read_table(out / "refused.csv")
    assert list(refused["method"]) == ["kvpress:*"] and "kvpress" in refused["reason"].item()
    board = read_table(out / "leaderboard.csv")
    from fi_toolkit.policies.registry import POLICY, entries

    assert set(board["method"]) == {e.name for e in entries() if e.kind == POLICY} | {"random-positions", "fi-oracle"}
    assert (board["headroom_ci_near"] == NO_INTERVAL).all()
    assert "nan" not in (out / "leaderboard.json").read_text()


def _fi_rows(values: dict[tuple[str, str], float]) -> pd.DataFrame:
    """A field fi table with one chunk: ``{(document, method): fi}``; the anchors are methods named so."""
    rows = []
    for (doc, method), fi in values.items():
        kind = "anchor" if method in ("random-positions", "fi-oracle") else "policy"
        sel = "policy:fi-oracle@keep=0.5:chunk=10:20" if method == "fi-oracle" else f"{method}@keep=0.5"
        rows.append(
            {"document": doc, "method": method, "kind": kind, "budget": "keep=0.5", "selection": sel, "chunk": "10:20"}
            | {"distance_from_p": 0, "fi": fi, "compress_seconds": 0.1, "n_removed": 5, "n_kept": 5}
        )
    return pd.DataFrame(rows)


def test_summaries_test_each_method_against_the_best_and_say_when_one_document_gives_no_interval():
    values = {}
    docs = ["a", "b", "c", "d", "e", "f"]
    for i, d in enumerate(docs):
        values |= {(d, "random-positions"): 1.0, (d, "fi-oracle"): 0.0, (d, "good"): 0.2 + 0.01 * i}
        values |= {(d, "bad"): 0.5 + 0.02 * i}
    out = field_summaries(_fi_rows(values), pd.DataFrame(), resamples=100)
    t = out["tests"].set_index("method")
    assert t.loc["bad", "best"] == "good" and t.loc["bad", "method_wins"] == 0
    assert t.loc["bad", "wilcoxon_p"] == pytest.approx(1 / 64)  # every difference positive: exact p = 2^-6
    board = out["leaderboard"].set_index("method")
    assert board.loc["good", "headroom_near"] == pytest.approx(1 - np.mean([0.2 + 0.01 * i for i in range(6)]))
    assert board.loc["good", "rank_near"] == 1 and board.loc["bad", "rank_near"] == 2

    one = field_summaries(_fi_rows({k: v for k, v in values.items() if k[0] == "a"}), pd.DataFrame(), resamples=100)
    assert (one["leaderboard"]["headroom_ci_near"] == NO_INTERVAL).all()
    assert one["tests"]["note"].tolist() == [NEEDS_TWO]


@pytest.mark.parametrize(
    "args, message",
    [
        (["alice", "--policy", "no-such-policy"], "unknown policy 'no-such-policy'"),
        (["alice", "--budget", "keep=1.5"], "keep=1.5"),
        (["alice", "--budget", "keep=100"], "not a token count"),
        (["alice", "--budget", "remove=0.9"], "removing"),
        (["alice", "--policy", "fi-oracle"], "anchor"),
        ([], "give at least one document"),
        (["alice", "--length", "300"], "goes with --replay"),
    ],
)
def test_bad_input_is_one_line_before_the_model_loads(args, message, capsys, monkeypatch, tmp_path):
    from fi_toolkit.model.settings import ModelSettings

    def no_model(self):  # pragma: no cover - reached only if a check is missing
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(ModelSettings, "load", no_model)
    code, _, stderr = run_cli(["field", *args, "--prefix", "256", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and stderr.startswith("error: ")
    assert message in stderr
    assert not (tmp_path / "o").exists()


def test_unwritable_out_is_one_line(capsys, monkeypatch, tmp_path):
    from fi_toolkit.model.settings import ModelSettings

    monkeypatch.setattr(ModelSettings, "load", lambda self: (_ for _ in ()).throw(AssertionError("loaded")))
    (tmp_path / "f").write_text("a regular file\n")
    code, _, stderr = run_cli(["field", "alice", "--prefix", "128", "--out", str(tmp_path / "f" / "o")], capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and stderr.startswith("error: ")


@pytest.mark.kvpress
@pytest.mark.smollm
def test_a_press_that_cannot_run_is_listed_and_the_rest_completes(tmp_path, capsys):
    pytest.importorskip("kvpress")
    out = tmp_path / "run"
    args = ["field", "alice", *COMMON, "--distances", "0", "--chunk-len", "32", "--budget", "keep=0.5", *ORACLE]
    args += ["--policy", "snapkv", "--policy", "kvpress:KVzapPress", "--policy", "kvpress:SnapKVPress"]
    _run([*args, "--resamples", "50", "--out", str(out)], capsys)
    refused = read_table(out / "refused.csv")
    assert refused["method"].tolist() == ["kvpress:KVzapPress"] and refused["stage"].tolist() == ["prefill"]
    board = read_table(out / "leaderboard.csv")
    assert {"snapkv", "kvpress:SnapKVPress"} <= set(board["method"]) and "kvpress:KVzapPress" not in set(
        board["method"]
    )
    fi = read_table(out / "fi.csv")
    assert set(fi[fi["method"] == "kvpress:SnapKVPress"]["selection"]) == {"kvpress:SnapKVPress@keep=0.5"}


@pytest.mark.smollm
def test_field_task_accuracy_equals_fi_eval_task_answers(tmp_path, capsys):
    """With --task every method answers the generated tasks as fi eval --task answers them: the same outputs,
    the same correctness and answer KL, bit for bit; the leaderboard's accuracy is the mean of the answers'
    correctness computed here from answers.csv, and the full cache's is beside it."""
    task = ["--task", "passkey", "--max-new", "8", "--interval", "4"]
    field = ["field", "alice", "--policy", "snapkv", "--policy", "h2o", *COMMON, "--distances", "0,64", *ORACLE]
    field += ["--chunk-len", "32", "--budget", "keep=0.5", "--resamples", "50", "--seeds", "1", *task]
    stdout, _ = _run([*field, "--task-context", "200", "--task-samples", "2", "--out", str(tmp_path / "f")], capsys)
    evaluate = ["eval", "--policy", "snapkv,h2o", "--budget", "keep=0.5", *task, "--context", "200"]
    _run([*evaluate, "--samples", "2", "--resamples", "0", "--out", str(tmp_path / "e")], capsys)

    mine = read_table(tmp_path / "f" / "answers.csv")
    theirs = read_table(tmp_path / "e" / "answers.csv")
    keys = ["task", "context", "seed", "protocol", "policy", "budget"]
    mine, theirs = (t.sort_values(keys, kind="stable").reset_index(drop=True) for t in (mine, theirs))
    assert len(mine) == 2 * 3  # two samples x (full cache, snapkv, h2o)
    assert list(mine["method"]) == [{"full": "full"}.get(p, p) for p in mine["policy"]]
    for column in ("output", "correct", "compressed_tokens", "kept_entries"):
        assert list(mine[column]) == list(theirs[column]), column
    assert mine["answer_kl"].to_numpy().tobytes() == theirs["answer_kl"].to_numpy().tobytes()

    board = read_table(tmp_path / "f" / "leaderboard.csv").set_index("method")
    for method in ("snapkv", "h2o"):
        expected = mine.loc[mine["method"] == method, "correct"].astype(bool).mean()
        assert board.loc[method, "accuracy"] == pytest.approx(expected, abs=1e-12)
    full = mine.loc[mine["method"] == "full", "correct"].astype(bool).mean()
    assert board.loc["snapkv", "full_accuracy"] == pytest.approx(full, abs=1e-12)
    assert np.isnan(board.loc["random-positions", "accuracy"])  # the anchors select in prefill only
    assert "accur" in stdout  # the printed leaderboard has the column (rich shortens its header)


@pytest.mark.kvpress
@pytest.mark.smollm
def test_a_method_failing_while_it_answers_a_task_is_refused_and_the_rest_answer_as_without_it(tmp_path, capsys):
    """CompactorPress scores at the prefill only: at its first compression while decoding it fails. The field lists it
    in refused.csv (stage tasks, once for both samples) and SnapKV answers exactly as fi eval --task answers alone."""
    pytest.importorskip("kvpress")
    task = ["--task", "passkey", "--max-new", "8", "--interval", "4"]
    field = ["field", "alice", "--policy", "snapkv", "--policy", "kvpress:CompactorPress", *COMMON, *ORACLE]
    field += ["--distances", "0", "--chunk-len", "32", "--budget", "keep=0.5", "--resamples", "0", "--seeds", "1"]
    _run([*field, *task, "--task-context", "200", "--task-samples", "2", "--out", str(tmp_path / "f")], capsys)
    evaluate = ["eval", "--policy", "snapkv", "--budget", "keep=0.5", *task, "--context", "200", "--samples", "2"]
    _run([*evaluate, "--resamples", "0", "--out", str(tmp_path / "e")], capsys)

    refused = read_table(tmp_path / "f" / "refused.csv")
    tasks = refused[refused["stage"] == "tasks"]
    assert tasks["method"].tolist() == ["kvpress:CompactorPress"] and "prefill" in tasks["reason"].iloc[0]
    keys = ["task", "context", "seed", "protocol", "policy", "budget"]
    mine, theirs = (
        read_table(tmp_path / d / "answers.csv").sort_values(keys, kind="stable").reset_index(drop=True)
        for d in ("f", "e")
    )
    assert set(mine["method"]) == {"full", "snapkv"} and len(mine) == len(theirs) == 2 * 2
    for column in ("output", "correct", "compressed_tokens", "kept_entries"):
        assert list(mine[column]) == list(theirs[column]), column
    assert mine["answer_kl"].to_numpy().tobytes() == theirs["answer_kl"].to_numpy().tobytes()


def test_the_headroom_carries_the_oracle_anchors_seed_noise():
    """The oracle anchor again at label seed 1 (``...:chunk=C,seed=1``) is no method or reference of its own; beside
    each headroom, the standard deviation over the two seeds of the oracle's mean FI and of the headroom with each
    seed's oracle as the reference (recomputed here from the values)."""
    docs = "abcdef"
    values = {}
    for i, d in enumerate(docs):
        values |= {(d, "random-positions"): 1.0 + 0.1 * i, (d, "fi-oracle"): 0.1 + 0.01 * i}
        values |= {(d, "good"): 0.3 + 0.02 * i}
    fi = _fi_rows(values)
    other = fi[fi["method"] == "fi-oracle"].assign(selection="policy:fi-oracle@keep=0.5:chunk=10:20,seed=1")
    other["fi"] = [0.12 + 0.005 * i for i in range(len(docs))]
    out = field_summaries(pd.concat([fi, other], ignore_index=True), pd.DataFrame(), resamples=100)
    hr = out["headroom"].set_index("method")
    r = np.mean([1.0 + 0.1 * i for i in range(6)])
    s = np.mean([0.3 + 0.02 * i for i in range(6)])
    o0, o1 = np.mean([0.1 + 0.01 * i for i in range(6)]), np.mean([0.12 + 0.005 * i for i in range(6)])
    assert set(hr.index) == {"random-positions", "fi-oracle", "good"}
    assert hr.loc["good", "headroom"] == pytest.approx((r - s) / (r - o0))  # seed 0 stays the reference
    assert hr.loc["good", "oracle_seeds"] == 2
    assert hr.loc["good", "fi_oracle_seed_sd"] == pytest.approx(abs(o0 - o1) / np.sqrt(2))
    want = abs((r - s) / (r - o0) - (r - s) / (r - o1)) / np.sqrt(2)
    assert hr.loc["good", "headroom_seed_sd"] == pytest.approx(want)
    board = out["leaderboard"].set_index("method")
    assert board.loc["good", "headroom_seed_sd_near"] == pytest.approx(want)
    assert np.isnan(field_summaries(fi, pd.DataFrame(), resamples=100)["headroom"]["headroom_seed_sd"]).all()
