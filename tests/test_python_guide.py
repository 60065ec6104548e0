"""The Python guide's run-function examples (docs/guides/python.md, "A command from Python"), run verbatim
with the embedded model, and checked against the command line: ``run_probe`` gives the FI that ``fi probe``
writes with the same options, ``run_field`` the leaderboard that ``fi field`` writes, ``run_correlate`` and
``run_nearfar`` the tables that ``fi correlate`` and ``fi nearfar`` write (each also against a recomputation
from its own per-token or per-set table), ``run_eval`` the replay tables that ``fi eval`` writes, ``run_fit_data``
and ``run_fit`` the rows and the policy file that ``fi fit-data`` and ``fi fit`` write, ``run_view`` and
``run_task_export`` the page and files of ``fi view`` and ``fi tasks export``, ``run_scores`` the file that
``fi scores`` writes and ``run_generate`` the text and statistics that ``fi generate`` prints."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from scipy import stats

from fi_toolkit.runs.results import write_table
from fi_toolkit.runs.resumable import read_table

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "python.md"


def section_blocks(title: str) -> list[str]:
    """The ```python blocks of the guide's section ``## title`` (up to the next ``## `` heading)."""
    text = GUIDE.read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def block_with(name: str) -> str:
    """The one example of the section that calls ``name``."""
    (block,) = [b for b in section_blocks("A command from Python") if f"{name}(" in b]
    return block


def test_the_section_holds_twelve_examples_of_three_lines():
    blocks = section_blocks("A command from Python")
    assert len(blocks) == 12
    for block in blocks:  # the imports, then three lines (the model is loaded once, in the first)
        lines = [line for line in block.splitlines() if line and not line.startswith(("from ", "import "))]
        assert len(lines) - ("load_model()" in block) == 3


@pytest.mark.smollm
def test_the_run_function_examples_run_and_equal_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    blocks = section_blocks("A command from Python")
    for block in blocks[:2] + [block_with("run_eval")]:  # probe, field and eval (the others: their own tests)
        exec(compile(block, str(GUIDE), "exec"), scope)
    probed, tables = scope["probed"], scope["tables"]

    probe = ["probe", "alice", "--chunk", "128:160", "--chunk", "192:224", "--select", "attention:remove=0.1"]
    code, _, err = run_cli([*probe, "--select", "random:remove=0.1@0-1", "--out", "p"], capsys)
    assert code == 0, err
    assert len(probed.fi) == 2 * (2 + 1 + 2)  # chunks x (2 noise controls, attention, 2 random seeds)
    write_table(tmp_path / "python.csv", probed.fi)
    assert (tmp_path / "python.csv").read_bytes() == (tmp_path / "p" / "fi.csv").read_bytes()  # byte for byte

    field = ["field", "alice", "--policy", "snapkv", "--policy", "h2o", "--budget", "keep=0.5", "--prefix", "128"]
    code, _, err = run_cli([*field, "--distances", "0,64", "--chunk-len", "32", "--out", "f"], capsys)
    assert code == 0, err
    board = read_table(tmp_path / "f" / "leaderboard.csv")
    assert set(board["method"]) == {"snapkv", "h2o", "random-positions", "fi-oracle"}
    mine = read_table(tmp_path / "runs" / "field" / "leaderboard.csv")  # what run_field wrote
    for column in ("fi_near", "fi_far", "headroom_near", "headroom_far"):
        ours, theirs = (t.set_index("method")[column].sort_index().to_numpy() for t in (mine, board))
        assert ours.tobytes() == theirs.tobytes(), column
    assert list(tables["leaderboard"]["method"]) == list(mine["method"])

    evals = ["eval", "alice", "--policy", "snapkv", "--budget", "keep=0.5", "--prompt", "128", "--length", "224"]
    code, _, err = run_cli([*evals, "--interval", "32", "--free-tokens", "8", "--out", "e"], capsys)
    assert code == 0, err
    replays = scope["replays"]
    assert list(replays["replay_summary"]["policy"]) == ["full", "snapkv"]
    for name in ("replay_summary", "segment_summary", "positions"):  # no wall time in these: byte for byte
        mine, theirs = (tmp_path / d / f"{name}.csv" for d in (Path("runs") / "eval", Path("e")))
        assert mine.read_bytes() == theirs.read_bytes(), name

    exec(compile(block_with("build_report"), str(GUIDE), "exec"), scope)  # the report of the two runs above
    code, _, err = run_cli(["report", "runs/field", "runs/eval", "--format", "md,csv", "--out", "r"], capsys)
    assert code == 0, err
    written = sorted(str(Path(p).resolve().relative_to((tmp_path / "report").resolve())) for p in scope["written"])
    theirs = (tmp_path / "r").resolve()
    assert written == sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file())
    assert "figures/field__field_headroom.png" in written and "report.md" in written
    assert (tmp_path / "report" / "report.md").read_text() == (tmp_path / "r" / "report.md").read_text()


@pytest.mark.smollm
def test_the_study_examples_run_and_equal_the_command_line(tmp_path, monkeypatch, capsys):
    """run_correlate and run_nearfar as the guide calls them (p = 128, one document, alice) write the tables
    ``fi correlate`` and ``fi nearfar`` write with the same options, byte for byte; the correlations are the
    Spearman rho of the per-token table recomputed with scipy, the near/far shares FI over the near chunk's."""
    from fi_toolkit import load_documents, load_model

    monkeypatch.chdir(tmp_path)
    scope: dict = {"lm": load_model(), "load_documents": load_documents}
    for block in section_blocks("A command from Python")[2:4]:
        exec(compile(block, str(GUIDE), "exec"), scope)
    found, nearfar = scope["found"], scope["nearfar"]

    args = ["correlate", "alice", "--chunk", "128:160", "--candidates", "sample:16", "--resamples", "100"]
    code, _, err = run_cli([*args, "--out", "c"], capsys)
    assert code == 0, err
    args = ["nearfar", "alice", "--prefix", "128", "--distances", "0,32", "--chunk-len", "32", "--seeds", "1"]
    code, _, err = run_cli([*args, "--out", "n"], capsys)
    assert code == 0, err
    for ours, theirs, names in (
        ("runs/corr", "c", ("tokens", "correlations", "correlation_summary", "controls")),
        ("runs/nearfar", "n", ("nearfar", "nearfar_summary", "nearfar_tests", "token_classes")),
    ):
        for name in names:
            assert (tmp_path / ours / f"{name}.csv").read_bytes() == (tmp_path / theirs / f"{name}.csv").read_bytes()

    tokens = found["tokens"]
    assert len(tokens) == 16 and set(tokens["document"]) == {"alice"}  # 16 sampled candidates, one chunk
    rho = found["correlations"].set_index(["scope", "signal", "method"]).loc[("mean", "A", "spearman"), "rho"]
    assert rho == pytest.approx(stats.spearmanr(tokens["fi"], tokens["attention"]).statistic, abs=1e-12)

    sets = nearfar["nearfar"].query("selector != 'control'").set_index(["sinks", "selection", "distance_from_p"])
    share = sets["fi"].xs(32, level="distance_from_p") / sets["fi"].xs(0, level="distance_from_p")
    np.testing.assert_allclose(sets["fi_share_near"].xs(32, level="distance_from_p"), share, rtol=1e-12)
    assert len(share) == 2 * 5  # entropy, attention, distance, infokv and one random set, with and without sinks


@pytest.mark.smollm
def test_the_page_and_task_examples_write_what_the_command_line_writes(tmp_path, monkeypatch, capsys):
    """run_view's page equals fi view's with the same options (all but the estimate's clock); run_task_export's
    files equal fi tasks export's (the YAMLs name their data files by absolute path: compared with it replaced)."""
    import json

    from fi_toolkit import load_model

    monkeypatch.chdir(tmp_path)
    scope: dict = {"lm": load_model()}
    for name in ("run_view", "run_task_export"):
        exec(compile(block_with(name), str(GUIDE), "exec"), scope)

    view = ["view", "alice", "--policy", "h2o,snapkv", "--budget", "keep=0.5", "--prefix", "128", "--chunk", "128:192"]
    code, _, err = run_cli([*view, "--samples", "2", "--out", "cli.html"], capsys)
    assert code == 0, err
    pages = []
    for path in ("alice.html", "cli.html"):
        payload = re.search(r"id='fi-data'>(.*?)</script>", (tmp_path / path).read_text(), re.S).group(1)
        pages.append(json.loads(payload))
        pages[-1]["settings"].pop("estimate_seconds")
    assert pages[0] == pages[1]
    assert set(scope["shown"].evicted) == {"h2o@keep=0.5", "snapkv@keep=0.5"}

    code, _, err = run_cli(
        ["tasks", "export", "--task", "passkey", "--context", "256", "--samples", "2", "--out", "t"], capsys
    )
    assert code == 0, err
    assert [p.name for p in scope["yamls"]] == ["fi_passkey.yaml"]
    for name in ("fi_passkey.jsonl", "fi_passkey.yaml", "fi_scoring.py"):
        ours, theirs = ((tmp_path / d / name).read_text() for d in ("tasks", "t"))
        assert ours.replace(str(tmp_path / "tasks"), "OUT") == theirs.replace(str(tmp_path / "t"), "OUT"), name


@pytest.mark.smollm
def test_the_fit_examples_run_and_equal_the_command_line(tmp_path, monkeypatch, capsys):
    """run_fit_data and run_fit as the guide calls them (p = 64, alice and hamlet, two label draws): the rows
    ``fi fit-data`` writes with the same options and the policy file ``fi fit`` writes from the same run, byte
    for byte; the record returned is the file's, and its rows are every layer, KV head and position before the
    window."""
    import json

    from fi_toolkit import load_documents, load_model

    monkeypatch.chdir(tmp_path)
    scope: dict = {"lm": load_model(), "load_documents": load_documents}
    for block in [b for b in section_blocks("A command from Python") if "run_fit" in b]:
        exec(compile(block, str(GUIDE), "exec"), scope)
    rows, policy = scope["rows"], scope["policy"]

    code, _, err = run_cli(["fit-data", "alice", "hamlet", "--chunk", "64:96", "--samples", "2", "--out", "fd"], capsys)
    assert code == 0, err
    assert (tmp_path / "fd" / "fit_rows.parquet").read_bytes() == (
        tmp_path / "runs/fitdata/fit_rows.parquet"
    ).read_bytes()
    code, stdout, err = run_cli(["fit", "runs/fitdata", "--features", "decoding", "--out", "p.json"], capsys)
    assert code == 0, err
    assert (tmp_path / "p.json").read_bytes() == (tmp_path / "runs" / "policy.json").read_bytes()
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(json.dumps(policy))
    assert len(rows) == 2 * 30 * 3 * (64 - 32) and list(dict.fromkeys(rows["document"])) == ["alice", "hamlet"]
    assert f"fitted {policy['cross_validation']['mean']['spearman_fitted']:+.3f}" in stdout


def _untimed_rows(text: str) -> list[list[str]]:
    """The cells of a rich table's rows, but the rows that hold wall time or process memory (they differ from
    run to run by nature: prefill, decoding, compression time, peak memory)."""
    timed = ("prefill", "decoding", "compression time", "peak memory")
    rows = [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines() if "│" in line]
    return [r for r in rows if not r[0].startswith(timed)]


@pytest.mark.smollm
def test_the_scores_and_generate_examples_equal_the_command_line(tmp_path, monkeypatch, capsys):
    """run_scores writes the file ``fi scores`` writes with the same options, byte for byte; run_generate gives
    the text ``fi generate`` prints (streamed, then a newline) and its statistics but the timed rows."""
    from rich.console import Console

    from fi_toolkit import load_documents, load_model
    from fi_toolkit.cli.generate import stats_table

    monkeypatch.chdir(tmp_path)
    scope: dict = {"lm": load_model(), "load_documents": load_documents}
    for name in ("run_scores", "run_generate"):
        exec(compile(block_with(name), str(GUIDE), "exec"), scope)

    args = ["scores", "alice", "--prefix", "128", "--fi-chunk", "128:160", "--estimator", "fisher", "--samples", "4"]
    code, _, err = run_cli([*args, "--out", "cli.csv"], capsys)
    assert code == 0, err
    assert (tmp_path / "scores.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    per_token = scope["per_token"]
    assert len(per_token) == 128 and per_token["fi_128:160"].notna().all() and "fi_se_128:160" in per_token

    prompt = "Tell me a short story about a white rabbit who is always late."
    args = ["generate", prompt, "--policy", "snapkv", "--budget", "keep=40", "--interval", "8", "--max-new", "24"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    result, generation = scope["result"], scope["generation"]
    assert out == result.text + "\n" and result.stats.new_tokens == 24 and result.stats.compressions == 2
    table = Console(file=io.StringIO(), width=200, record=True)
    table.print(stats_table(result.stats, generation.label))
    assert f"generation ({generation.label})" in err and generation.label == "snapkv@keep=40"
    rows = _untimed_rows(err)  # prompt and new tokens, compressions, cache full, kept and at peak
    assert len(rows) == 6 and _untimed_rows(table.export_text()) == rows
