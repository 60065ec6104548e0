"""``fi eval``: shared prefills equal separate ones, free generation equals generate(), the
full budget equals the full cache, question-agnostic compression never sees the question, summaries
and resumable runs; the command line on SmolLM2 (``smollm``)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runner import run_cli
from scipy import stats

from fi_toolkit import Document
from fi_toolkit.compress.decoder import CompressedDecoder, generate, signal_config_for
from fi_toolkit.compress.replay import SharedPrompt, replay
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation import (
    SampleUnit,
    TextSetting,
    divergence,
    evaluate_sample,
    evaluate_text,
    free_generation,
    kl_accuracy_table,
    mean_ci,
    parse_future,
    run_eval_text,
)
from fi_toolkit.evaluation.tasks import encode_split, make_sample
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.model.loading import LoadedModel
from fi_toolkit.policies import make_policy

P, N, INTERVAL, W = 96, 224, 32, 16
NAMES = ["infokv", "infokv-adaptive", "snapkv", "pyramidkv", "streaming", "h2o", "knorm", "random", "rpc"]


def _policy(name, budget=0.4):
    return make_policy(name, budget=budget, window=W)


def _ids(n=N, seed=1):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


# ---- one shared prefill, forked per policy --------------------------------------------------------------


def test_fork_equals_its_own_prefill_bitwise(tiny):
    """A fork of the shared prefill continues exactly as a decoder that prefilled alone (same keep maps,
    same logits through a block, a compression and another block), for every policy."""
    ids, model = _ids(), tiny.model
    parent = None
    for name in NAMES:
        policy = _policy(name)
        outs, keeps = [], []
        for forked in (False, True):
            if forked:
                if parent is None:
                    parent = CompressedDecoder.shared(model, N, signal_config_for(_policy("infokv")))
                    with ragged_attention(model):
                        parent.prefill(ids[:P])
                decoder, keep = parent.fork(policy)
            else:
                decoder = CompressedDecoder(model, policy, N)
                with ragged_attention(model):
                    _, keep = decoder.prefill(ids[:P])
            with ragged_attention(model):
                a = decoder.block(ids[P : P + 40])
                decoder.compress()
                b = decoder.block(ids[P + 40 : P + 80])
            decoder.close()
            outs.append(torch.cat([a, b]))
            keeps.append(keep)
        assert torch.equal(outs[0], outs[1]), name
        if keeps[0] is None:
            assert keeps[1] is None
        else:
            assert all(torch.equal(x, y) for x, y in zip(keeps[0].keep, keeps[1].keep)), name


def test_fork_refuses_other_signal_options(tiny):
    parent = CompressedDecoder.shared(tiny.model, N)
    with ragged_attention(tiny.model):
        parent.prefill(_ids()[:P])
    with pytest.raises(FIError, match="window"):
        parent.fork(_policy("snapkv"))  # window 16, the shared prefill tracked 32
    with pytest.raises(FIError, match="shared"):
        CompressedDecoder(tiny.model, None, N).fork(None)


def test_shared_prompt_replay_is_the_plain_replay(tiny):
    ids = _ids()
    config = signal_config_for(_policy("h2o"))
    shared = SharedPrompt(tiny.model, ids, P, config)
    for name in ("infokv", "h2o", "rpc", None):
        policy = _policy(name) if name else None
        a = replay(tiny.model, ids, P, policy, INTERVAL, config)
        b = replay(tiny.model, ids, P, policy, INTERVAL, config, shared=shared)
        assert torch.equal(a.kl, b.kl) and torch.equal(a.nll_compressed, b.nll_compressed), name
        assert a.compression_steps == b.compression_steps
    with pytest.raises(FIError, match="other token ids"):
        replay(tiny.model, _ids(seed=2), P, None, INTERVAL, shared=shared)


# ---- free generation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["infokv", "h2o", "streaming", "pyramidkv"])
def test_free_generation_is_generate(tiny, name):
    """The forked greedy loop produces generate()'s tokens (generate prefills and decodes on its own)."""
    ids, policy = _ids(), _policy(name)
    shared = SharedPrompt(tiny.model, ids[: P + 1], P, signal_config_for(policy), capacity=P + 80)
    mine = free_generation(shared, policy, 80, INTERVAL)
    theirs = generate(tiny.model, None, ids[:P], policy, max_new_tokens=80, interval=INTERVAL, eos_token_id=[]).tokens
    assert mine == theirs
    assert (
        free_generation(shared, None, 80, INTERVAL)
        == generate(tiny.model, None, ids[:P], None, max_new_tokens=80, eos_token_id=[]).tokens
    )


def test_divergence():
    assert divergence([1, 2, 3, 4], [1, 2, 3, 4]) == (4, 1.0)
    assert divergence([1, 9, 3, 4], [1, 2, 3, 4]) == (1, 0.75)
    assert divergence([9, 2], [1, 2]) == (0, 0.5)


def test_greedy_generated_future_diverges_where_the_replay_first_disagrees(tiny):
    """On the model's own greedy continuation, teacher forcing equals free generation until the first
    top-1 disagreement: the replay (blocks) and the free generation (steps) must put it at the same token."""
    policies = [_policy(n, 0.3) for n in ("infokv", "snapkv", "streaming")]
    setting = TextSetting(prompt=P, interval=INTERVAL, future=parse_future("generated:120"), free_tokens=120)
    tables = evaluate_text(tiny.model, _ids(), "doc", policies, setting)
    rep, pos = tables["replays"], tables["positions"]
    for policy in ("infokv", "snapkv", "streaming"):
        agree = pos[pos.policy == policy]["top1_agree"].to_numpy().astype(bool)
        first = int(np.argmin(agree)) if not agree.all() else len(agree)
        assert first < 120  # the random tiny model diverges somewhere
        assert rep.set_index("policy").loc[policy, "free_first_divergence"] == first


def test_full_budget_is_the_full_cache(tiny):
    """keep=1.0 never evicts: KL <= 1e-6 at every position, top-1 always agrees, free generation never diverges."""
    policies = [make_policy(n, budget="keep=1.0", window=32) for n in ("infokv", "snapkv", "h2o")]
    tables = evaluate_text(
        tiny.model, _ids(), "doc", policies, TextSetting(prompt=P, length=N, interval=INTERVAL, free_tokens=40)
    )
    pos, rep = tables["positions"], tables["replays"]
    assert (pos["kl"].abs() <= 1e-6).all() and pos["top1_agree"].all()
    assert (rep["compressions"] == 0).all() and (rep["free_first_divergence"] == 40).all()
    full = rep[rep.policy == "full"].iloc[0]
    assert full["mean_kl"] == pytest.approx(0, abs=1e-6) and full["delta_nll"] == pytest.approx(0, abs=1e-6)


def test_text_tables_are_consistent(tiny):
    policies = [_policy("infokv", 0.3), _policy("rpc", 0.3)]
    tables = evaluate_text(
        tiny.model, _ids(), "doc", policies, TextSetting(prompt=P, length=N, interval=INTERVAL, free_tokens=8)
    )
    pos, seg, rep = tables["positions"], tables["segments"], tables["replays"]
    assert list(rep.policy) == ["full", "infokv", "rpc"]
    for policy, part in pos.groupby("policy"):
        r = rep.set_index("policy").loc[policy]
        assert len(part) == N - P == r["positions"]
        assert part["kl"].mean() == pytest.approx(r["mean_kl"], rel=1e-6, abs=1e-12)
        assert (part["nll_compressed"] - part["nll_full"]).mean() == pytest.approx(r["delta_nll"], abs=1e-9)
        s = seg[seg.policy == policy]
        assert s["positions"].sum() == len(part) and len(s) == r["compressions"] + 1
    infokv = seg[seg.policy == "infokv"]
    assert list(infokv["compressed_at_seen"][1:]) == [P + k * INTERVAL for k in range(len(infokv) - 1)]


# ---- tasks on the tiny model with a character tokenizer -------------------------------------------------


class Chars:
    """One token per character (ids < 256), no chat template: real prompts for the tiny random model."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 256 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _unit(task="passkey", context=700, seed=0):
    return SampleUnit(task, context, seed, make_sample(task, Chars(), context, seed))


def test_question_agnostic_compression_never_sees_the_question(tiny):
    lm = LoadedModel(tiny.model, Chars(), "tiny", torch.device("cpu"), torch.float32)
    unit = _unit()
    seen: list[tuple[str, int]] = []

    class Spy(type(make_policy("snapkv"))):
        def keep_map(self, signals):
            seen.append(("keep_map", int(signals.seen)))
            return super().keep_map(signals)

    spy = Spy(budget=make_policy("snapkv", budget=0.3).budget)
    prefills = {}
    rows = evaluate_sample(
        lm,
        unit,
        [spy],
        ["question-agnostic", "question-aware"],
        max_new=6,
        on_prefill=lambda protocol, ids: prefills.setdefault(protocol, ids.clone()),
    )
    context, question = encode_split(Chars(), unit.sample, "question-agnostic")
    assert torch.equal(prefills["question-agnostic"], context) and question.numel() > 0
    assert torch.equal(prefills["question-aware"], torch.cat([context, question]))
    assert unit.sample.question not in Chars().decode(prefills["question-agnostic"].tolist())
    # the only compressions (answers are shorter than the interval; one fork answers, one is teacher-forced)
    # saw the context alone, then the whole prompt
    assert seen == [("keep_map", context.numel())] * 2 + [("keep_map", context.numel() + question.numel())] * 2
    agnostic = rows[rows.protocol == "question-agnostic"].set_index("policy")
    assert agnostic.loc["snapkv", "compressed_tokens"] == context.numel()
    assert agnostic.loc["snapkv", "kept_entries"] == round(0.3 * context.numel())


def test_task_full_budget_answers_exactly_as_the_full_cache(tiny):
    lm = LoadedModel(tiny.model, Chars(), "tiny", torch.device("cpu"), torch.float32)
    policies = [make_policy(n, budget="keep=1.0") for n in ("infokv", "snapkv")]
    for seed in range(2):
        rows = evaluate_sample(lm, _unit(seed=seed), policies, ["question-agnostic"], max_new=8)
        full = rows[rows.policy == "full"].iloc[0]
        for _, r in rows.iterrows():
            assert r["output"] == full["output"] and r["correct"] == full["correct"]
            assert r["answer_kl"] == pytest.approx(0, abs=1e-6) and r["answer_top1"] == 1.0
            assert r["first_divergence"] == r["answer_tokens"]


def test_task_answers_are_generate_outputs(tiny):
    """The greedy answer of a fork equals generate() on the same prompt ids (question-aware: one prefill)."""
    lm = LoadedModel(tiny.model, Chars(), "tiny", torch.device("cpu"), torch.float32)
    unit, policy = _unit(seed=3), make_policy("infokv", budget=0.3)
    rows = evaluate_sample(lm, unit, [policy], ["question-aware"], max_new=10)
    ids = torch.cat(encode_split(Chars(), unit.sample, "question-aware"))
    for pol, r in zip([None, policy], rows.itertuples()):
        g = generate(tiny.model, None, ids, pol, max_new_tokens=10, interval=1024)
        text = "".join(chr(t) for t in g.tokens)
        assert text.startswith(r.output) and len(r.output) >= 1  # the fork stops at the first line's end


# ---- summaries --------------------------------------------------------------------------------------------


def test_mean_ci():
    x = np.random.default_rng(0).normal(2.0, 1.0, 40)
    mean, lo, hi = mean_ci(x, 2000, seed=1)
    assert mean == pytest.approx(x.mean()) and lo < mean < hi
    t = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))  # an independent interval
    assert lo == pytest.approx(t[0], abs=0.1) and hi == pytest.approx(t[1], abs=0.1)
    assert mean_ci([1.0, 1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
    assert np.isnan(mean_ci([0.5])[1]) and np.isnan(mean_ci([0.5, 0.7, 0.9])[1:]).all()  # three: their range


def test_kl_accuracy_spearman():
    cells = pd.DataFrame(
        {
            "task": "passkey",
            "context": 1024,
            "protocol": "question-agnostic",
            "policy": ["full"] + ["a", "b", "c", "d", "e"],
            "budget": ["keep=1"] + ["keep=0.25"] * 5,
            "answer_kl": [0, 0.1, 0.2, 0.4, 0.8, 1.6],
            "accuracy": [1, 0.9, 0.7, 0.5, 0.3, 0.1],
        }
    )
    row = kl_accuracy_table(cells, None, 200).iloc[0]
    assert row["cells"] == 5 and row["rho"] == pytest.approx(-1.0)
    replays = pd.DataFrame(
        {
            "future": "document",
            "policy": ["a", "b", "c", "d", "e"],
            "budget": "keep=0.25",
            "mean_kl": [0.5, 0.1, 0.3, 0.2, 0.4],
        }
    )
    both = kl_accuracy_table(cells, replays, 200)
    expected = stats.spearmanr([0.5, 0.1, 0.3, 0.2, 0.4], [0.9, 0.7, 0.5, 0.3, 0.1]).statistic
    assert both.iloc[1]["rho"] == pytest.approx(expected)


# ---- runs ------------------------------------------------------------------------------------------------


def test_text_run_resumes_to_the_same_tables(tiny, tmp_path):
    docs = [Document(f"d{i}", f"text {i}", _ids(N, seed=10 + i), "test") for i in range(2)]
    policies = [_policy("snapkv", 0.3)]
    setting = TextSetting(prompt=P, length=N, interval=INTERVAL, free_tokens=8)
    config = signal_config_for(policies[0])
    whole = run_eval_text(tiny, docs, tmp_path / "a", policies, setting, config, n_resamples=50)

    calls = []
    import fi_toolkit.evaluation.run as run_module

    original = run_module.evaluate_text

    def stop_at_second(model, ids, name, *args, **kwargs):
        calls.append(name)
        if name == "d1":
            raise KeyboardInterrupt
        return original(model, ids, name, *args, **kwargs)

    run_module.evaluate_text = stop_at_second
    try:
        with pytest.raises(KeyboardInterrupt):
            run_eval_text(tiny, docs, tmp_path / "b", policies, setting, config, n_resamples=50)
    finally:
        run_module.evaluate_text = original
    resumed = run_eval_text(tiny, docs, tmp_path / "b", policies, setting, config, resume=True, n_resamples=50)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["computed_this_session"] == ["d1"] and manifest["kind"] == "text"
    assert set(manifest["noise_floor"]) == {"d0", "d1"}
    for name in ("positions", "replays", "segments", "replay_summary"):
        a = whole[name].drop(columns=["seconds"], errors="ignore")
        b = resumed[name].drop(columns=["seconds"], errors="ignore")
        pd.testing.assert_frame_equal(a, b)
    with pytest.raises(FIError, match="different settings"):
        run_eval_text(tiny, docs, tmp_path / "b", [_policy("snapkv", 0.5)], setting, config, resume=True)


def test_future_parsing():
    assert parse_future(None).label == "document"
    assert parse_future("generated:64").label == "generated:64" and parse_future("generated:64").seed is None
    assert parse_future("generated:8@3").seed == 3
    for bad in ("generated:0", "generated:-1", "generated", "generated:x", "book"):
        with pytest.raises(FIError):
            parse_future(bad)


# ---- the command line on SmolLM2 ------------------------------------------------------------------------


@pytest.mark.smollm
def test_cli_eval_text_and_tasks_then_report(smollm, tmp_path, capsys):
    text = tmp_path / "text"
    code, out, err = run_cli(
        [
            "eval",
            "alice",
            "--policy",
            "infokv,streaming",
            "--budget",
            "0.25",
            "--prompt",
            "256",
            "--length",
            "448",
            "--interval",
            "64",
            "--free-tokens",
            "8",
            "--out",
            str(text),
        ],
        capsys,
    )
    assert code == 0, err
    rep = pd.read_csv(text / "replay_summary.csv").set_index("policy")
    assert rep.loc["full", "mean_kl"] < 1e-6 and rep.loc["full", "top1_agreement"] == 1.0
    assert rep.loc["infokv", "mean_kl"] > 1e3 * max(rep.loc["full", "noise_floor"], 1e-9)
    assert "infokv" in out and "streaming" in out
    tasks = tmp_path / "tasks"
    code, out, err = run_cli(
        [
            "eval",
            "--task",
            "passkey,niah",
            "--context",
            "512",
            "--samples",
            "2",
            "--policy",
            "snapkv",
            "--budget",
            "0.5,keep=1.0",
            "--out",
            str(tasks),
        ],
        capsys,
    )
    assert code == 0, err
    s = pd.read_csv(tasks / "task_summary.csv")
    full = s[s.policy == "full"].set_index("task")["accuracy"]
    kept_all = s[s.budget == "keep=1.0"].set_index("task")["accuracy"]
    pd.testing.assert_series_equal(full, kept_all)  # a full budget gives the full-cache accuracy exactly
    assert set(s.task) == {"passkey", "multikey_needle"} and (s.samples == 2).all()
    answers = pd.read_csv(tasks / "answers.csv", keep_default_na=False)
    assert len(answers) == 2 * 2 * 3 and answers["answer"].astype(str).str.fullmatch(r"\d+").all()
    code, _, err = run_cli(["report", str(text), str(tasks), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    assert (tmp_path / "report" / "tables" / "replay_kl_vs_task_accuracy.csv").exists()
    for args in (
        ["--task", "passkey", "--context", "9000"],
        ["--task", "passkey", "--max-new", "99999999999"],
        ["--free-tokens", "99999999999"],
    ):  # bounds that need the model's context: one line, nothing written
        code, _, err = run_cli(["eval", *args, "--out", str(tmp_path / "x")], capsys)
        assert code == 2 and "exceeds the model's" in err and err.count("\n") == 1, err
        assert not (tmp_path / "x").exists()


def test_question_agnostic_answer_kl_is_a_replay(tiny):
    """Question-agnostic: the answer KL equals a replay (its own prefill, blocks, reference forward) of
    context + question + the full cache's answer with the context as the prompt and no later compression."""
    lm = LoadedModel(tiny.model, Chars(), "tiny", torch.device("cpu"), torch.float32)
    unit, policy = _unit(seed=1), make_policy("snapkv", budget=0.3)
    rows = evaluate_sample(lm, unit, [policy], ["question-agnostic"], max_new=8).set_index("policy")
    context, question = encode_split(Chars(), unit.sample, "question-agnostic")
    answer = torch.tensor([ord(c) for c in rows.loc["full", "output"]])
    ids = torch.cat([context, question, answer])
    r = replay(tiny.model, ids, context.numel(), policy, interval=10_000)
    answer_rows = r.kl[question.numel() :]  # rows from the question's last position on predict the answer
    assert len(answer_rows) == answer.numel()
    assert rows.loc["snapkv", "answer_kl"] == pytest.approx(float(answer_rows.double().mean()), rel=1e-4, abs=1e-7)
    assert rows.loc["snapkv", "answer_top1"] == pytest.approx(float(r.top1_agree[question.numel() :].double().mean()))


def test_report_of_a_text_run_and_a_task_run(tiny, tmp_path, monkeypatch):
    """fi report reads eval runs: their figures, their tables byte for byte, and the cross-run
    Spearman of replay KL against task accuracy recomputed here with scipy."""
    import fi_toolkit.evaluation.task_runs as task_runs
    from fi_toolkit.evaluation import run_eval_tasks
    from fi_toolkit.report import build_report

    # the random tiny model never answers right: a stand-in rule that varies with the output, so
    # accuracy is not constant and the Spearman is defined
    monkeypatch.setattr(task_runs, "score", lambda output, answer: sum(map(ord, output)) % 3 == 0)
    policies = [_policy(n, 0.3) for n in ("snapkv", "streaming", "knorm")] + [_policy("snapkv", 0.6)]
    config = signal_config_for(policies[0])
    docs = [Document(f"d{i}", f"text {i}", _ids(N, seed=20 + i), "test") for i in range(2)]
    run_eval_text(
        tiny,
        docs,
        tmp_path / "text",
        policies,
        TextSetting(prompt=P, length=N, interval=INTERVAL, free_tokens=4),
        config,
        n_resamples=50,
    )
    lm = LoadedModel(tiny.model, Chars(), "tiny", torch.device("cpu"), torch.float32)
    units = [_unit("passkey", 400, s) for s in range(3)]
    run_eval_tasks(lm, units, tmp_path / "tasks", policies, ["question-agnostic"], config, max_new=3, n_resamples=50)
    written = build_report([tmp_path / "text", tmp_path / "tasks"], tmp_path / "report")
    names = {p.name for p in written}
    assert {"text__replay_vs_retention.png", "text__kl_over_position.png", "tasks__accuracy_vs_retention.png"} <= names
    assert (tmp_path / "report" / "tables" / "text__replay_summary.csv").read_bytes() == (
        tmp_path / "text" / "replay_summary.csv"
    ).read_bytes()
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    cross = report["replay_kl_vs_task_accuracy"][0]
    replay = pd.read_csv(tmp_path / "text" / "replay_summary.csv")
    tasks = pd.read_csv(tmp_path / "tasks" / "task_summary.csv")
    kl = replay[replay.policy != "full"].set_index(["policy", "budget"])["mean_kl"]
    acc = tasks[tasks.policy != "full"].groupby(["policy", "budget"])["accuracy"].mean()
    both = pd.concat([kl, acc], axis=1, join="inner")
    expected = stats.spearmanr(both["mean_kl"], both["accuracy"]).statistic
    assert cross["cells"] == 4 and np.isfinite(expected)
    assert cross["rho"] == pytest.approx(expected)
    assert "Does mean replay KL predict task accuracy" in (tmp_path / "report" / "report.html").read_text()
