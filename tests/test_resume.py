"""Resumable studies: a run stopped after k of n documents and resumed equals an uninterrupted run,
recomputes nothing finished, refuses different settings, and trusts nothing it finds on disk."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import torch

from fi_toolkit import Document, SignalConfig
from fi_toolkit.cli import app as cli
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.runs.resumable import ResumableRun
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.studies import CorrelateSettings, NearfarSettings, read_table, run_correlate, run_nearfar, study

CFG = SignalConfig(window=8)
P = 96


@pytest.fixture(scope="module")
def docs():
    gen = torch.Generator().manual_seed(7)
    return [Document(f"doc {i}", f"text {i}", torch.randint(0, 256, (200,), generator=gen), "test") for i in range(3)]


def _nearfar(tiny, docs, out, resume=False, overwrite=False, **kw):
    settings = NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=2, signals=CFG)
    return run_nearfar(tiny, docs, settings, RunSettings(out, resume, overwrite), **kw)


class Counter:
    """Wraps a per-document function: counts calls, raises KeyboardInterrupt on call ``stop_at``."""

    def __init__(self, fn, stop_at=None):
        self.fn, self.stop_at, self.calls = fn, stop_at, []

    def __call__(self, model, doc, *args, **kwargs):
        self.calls.append(doc.name)
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        return self.fn(model, doc, *args, **kwargs)


TABLES = ["nearfar", "token_classes", "nearfar_summary", "nearfar_tests", "token_class_summary"]


def test_interrupted_nearfar_resumes_to_identical_tables(tiny, docs, tmp_path, monkeypatch):
    full = tmp_path / "full"
    _nearfar(tiny, docs, full)

    stopped = tmp_path / "stopped"
    first = Counter(study.nearfar_document, stop_at=3)  # dies while computing the third document
    monkeypatch.setattr(study, "nearfar_document", first)
    with pytest.raises(KeyboardInterrupt):
        _nearfar(tiny, docs, stopped)
    assert first.calls == ["doc 0", "doc 1", "doc 2"]
    finished = sorted(p.parent.name for p in (stopped / "per_document").glob("*/done.json"))
    assert finished == ["doc_0", "doc_1"]
    assert len(read_table(stopped / "per_document" / "doc_0" / "nearfar.csv")) > 0  # intact and readable
    assert not (stopped / "manifest.json").exists()

    second = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", second)
    _nearfar(tiny, docs, stopped, resume=True)
    assert second.calls == ["doc 2"]  # nothing finished is recomputed
    for name in TABLES:
        assert (stopped / f"{name}.csv").read_bytes() == (full / f"{name}.csv").read_bytes(), name
        pd.testing.assert_frame_equal(read_table(stopped / f"{name}.csv"), read_table(full / f"{name}.csv"))
    manifest = json.loads((stopped / "manifest.json").read_text())
    assert manifest["computed_this_session"] == ["doc 2"]

    third = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", third)
    _nearfar(tiny, docs, stopped, resume=True)  # everything finished: nothing recomputed
    assert third.calls == []


def test_resume_with_different_settings_is_refused(tiny, docs, tmp_path):
    out = tmp_path / "corr"
    chunks = [Chunk(P, P + 16)]
    run_correlate(tiny, docs[:1], CorrelateSettings(chunks, P, candidates="sample:4", resamples=20, signals=CFG), out)
    with pytest.raises(FIError, match="different settings.*candidates"):
        run_correlate(
            tiny,
            docs[:1],
            CorrelateSettings(chunks, P, candidates="sample:5", resamples=20, signals=CFG),
            RunSettings(out, resume=True),
        )
    with pytest.raises(FIError, match="already holds results \\(a 'correlate' run\\); pass resume"):
        run_correlate(
            tiny, docs[:1], CorrelateSettings(chunks, P, candidates="sample:4", resamples=20, signals=CFG), out
        )
    with pytest.raises(FIError, match="not 'correlate'|'correlate' run"):
        _nearfar(tiny, docs[:1], out, resume=True)
    before = (out / "correlations.csv").read_bytes()
    run_correlate(
        tiny,
        docs[:1],
        CorrelateSettings(chunks, P, candidates="sample:4", resamples=20, signals=CFG),
        RunSettings(out, resume=True),
    )
    assert (out / "correlations.csv").read_bytes() == before
    run_correlate(
        tiny,
        docs[:1],
        CorrelateSettings(chunks, P, candidates="sample:5", resamples=20, signals=CFG),
        RunSettings(out, overwrite=True),
    )
    assert read_table(out / "tokens.csv")["position"].nunique() == 5


def test_cli_refuses_different_settings_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"command": "nearfar", "settings": {"prefix": 1}}))
    sys_argv, sys.argv = (
        sys.argv,
        [
            "fi",
            "correlate",
            "alice",
            "--chunk",
            "64:96",
            "--prefix",
            "64",
            "--candidates",
            "sample:2",
            "--out",
            str(out),
            "--resume",
        ],
    )
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        sys.argv = sys_argv
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.splitlines() == [
        f"error: cannot resume: '{out}' holds a 'nearfar' run, not 'correlate' "
        "(--resume only continues the same command)"
    ]


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def reference(tiny, docs, tmp_path_factory):
    ref = tmp_path_factory.mktemp("resume") / "ref"
    _nearfar(tiny, docs, ref)
    return ref


@pytest.fixture
def finished(reference, tmp_path):
    """A copy of a finished 3-document nearfar run, and the run itself to compare with."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    return run, reference


def _cut_half(f):
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def _empty(f):
    f.write_bytes(b"")


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda d: _cut_half(d / "nearfar.csv"), r"nearfar.csv has \d+ rows, \d+ were written"),
        (lambda d: _empty(d / "token_classes.csv"), "token_classes.csv is empty"),
        (lambda d: (d / "nearfar.csv").unlink(), "nearfar.csv is missing"),
        (
            lambda d: (d / "nearfar.csv").write_bytes((d / "nearfar.csv").read_bytes().replace(b"0.", b"1.", 1)),
            r"nearfar.csv differs from what was written \(sha256 mismatch\)",
        ),
        (lambda d: (d / "done.json").write_text("{garbage"), "done.json is not valid JSON"),
        (lambda d: (d / "done.json").write_text("[]"), "done.json does not record"),
        (
            lambda d: (d / "done.json").write_text(json.dumps({"tables": ["nearfar", "token_classes"]})),
            "does not record",
        ),
    ],
)
def test_resume_recomputes_a_damaged_unit_and_says_so(finished, tiny, docs, monkeypatch, capsys, damage, problem):
    run, ref = finished
    damage(run / "per_document" / "doc_1")
    calls = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", calls)
    capsys.readouterr()
    _nearfar(tiny, docs, run, resume=True)
    assert calls.calls == ["doc 1"]  # only the damaged unit, and it is not silently trusted
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("note: per_document/doc_1 (doc 1): "), note
    assert __import__("re").search(problem, note[0]) and note[0].endswith("; recomputing it"), note
    for name in TABLES:  # no row lost: the tables equal the uninterrupted run's
        assert (run / f"{name}.csv").read_bytes() == (ref / f"{name}.csv").read_bytes(), name


def test_units_record_settings_rows_and_checksums(finished):
    import hashlib

    run, _ = finished
    unit = run / "per_document" / "doc_0"
    done = json.loads((unit / "done.json").read_text())
    assert done["settings"]["document"]["name"] == "doc 0" and done["settings"]["prefix"] == P
    assert done["settings"]["signals"]["entropy_of"] == CFG.entropy_of
    for name, info in done["tables"].items():
        data = (unit / f"{name}.csv").read_bytes()
        assert info["sha256"] == hashlib.sha256(data).hexdigest()
        assert info["rows"] == len(read_table(unit / f"{name}.csv")) > 0


def test_deleted_settings_never_mix_units_of_other_settings(finished, tiny, docs, monkeypatch, capsys):
    run, _ = finished
    (run / "settings.json").unlink()
    calls = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", calls)
    capsys.readouterr()
    fresh = run.parent / "fresh"
    run_nearfar(
        tiny,
        docs,
        NearfarSettings(P, [0, 48], 16, budget="remove=0.1", seeds=2, signals=CFG),
        RunSettings(run, resume=True),
    )
    assert calls.calls == ["doc 0", "doc 1", "doc 2"]  # every unit was computed under other settings
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 3 and all(
        "different settings (chunks: " in n and "distances: [0, 32] then, [0, 48] now" in n for n in notes
    )
    run_nearfar(tiny, docs, NearfarSettings(P, [0, 48], 16, budget="remove=0.1", seeds=2, signals=CFG), fresh)
    for name in TABLES:
        assert (run / f"{name}.csv").read_bytes() == (fresh / f"{name}.csv").read_bytes(), name


@pytest.mark.parametrize(
    "content",
    ["[]", "{garbage", json.dumps({"command": "nearfar"}), json.dumps({"command": "nearfar", "settings": [1]})],
)
def test_unreadable_settings_is_one_line(finished, tiny, docs, content):
    run, _ = finished
    (run / "settings.json").write_text(content)
    with pytest.raises(FIError, match=r"settings.json' is not a run's settings .*pass overwrite to start over"):
        _nearfar(tiny, docs, run, resume=True)


def test_resume_refusal_lists_top_level_settings_first(tiny, docs, tmp_path):
    out = tmp_path / "corr"
    chunks = [Chunk(P, P + 16)]
    run_correlate(tiny, docs[:1], CorrelateSettings(chunks, P, candidates="sample:4", resamples=20, signals=CFG), out)
    other = SignalConfig(window=9, top_k=100, alpha=0.5, tau=2.0, pool_kernel=3, entropy_of="next")
    with pytest.raises(FIError) as exc:  # 6 nested signal settings differ, and "sinks" sorts after "signals"
        run_correlate(
            tiny,
            docs[:1],
            CorrelateSettings(chunks, P, candidates="sample:4", sinks=5, resamples=20, signals=other),
            RunSettings(out, resume=True),
        )
    message = str(exc.value)
    assert message.split("(", 1)[1].startswith("sinks: 4 then, 5 now; signals.alpha: 0.9 then, 0.5 now; "), message
    assert message.count(" then, ") == 7 or "more" in message


def test_resume_and_overwrite_together_are_refused(tiny, docs, tmp_path):
    with pytest.raises(FIError, match="resume and overwrite contradict each other"):
        _nearfar(tiny, docs[:1], tmp_path / "x", resume=True, overwrite=True)
    assert not (tmp_path / "x").exists()


def test_other_results_need_overwrite(tiny, docs, tmp_path):
    probe_run = tmp_path / "probe"
    probe_run.mkdir()
    (probe_run / "manifest.json").write_text(json.dumps({"command": "probe"}))
    (probe_run / "fi.csv").write_text("selection,fi\nentropy:0.1,0.5\n")
    before = _snapshot(probe_run)
    with pytest.raises(
        FIError, match=r"already holds results \(a 'probe' run\); choose another out_dir or pass overwrite"
    ):
        _nearfar(tiny, docs[:1], probe_run)
    with pytest.raises(FIError, match=r"holds a 'probe' run, not 'nearfar' \(resume only continues the same command\)"):
        _nearfar(tiny, docs[:1], probe_run, resume=True)
    assert _snapshot(probe_run) == before
    _nearfar(tiny, docs[:1], probe_run, overwrite=True)
    assert not (probe_run / "fi.csv").exists()  # the probe's results are replaced, not mixed in
    assert json.loads((probe_run / "manifest.json").read_text())["command"] == "nearfar"


def test_failure_before_the_first_document_leaves_nothing(tiny, docs, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise FIError("bad input found while computing")

    monkeypatch.setattr(study, "nearfar_document", fail)
    out = tmp_path / "new"
    with pytest.raises(FIError, match="bad input"):
        _nearfar(tiny, docs, out)
    assert not out.exists()  # no settings.json, no empty directory to block the next valid run
    monkeypatch.undo()
    _nearfar(tiny, docs[:1], out)
    assert (out / "manifest.json").exists()
    before = _snapshot(out)
    monkeypatch.setattr(study, "nearfar_document", fail)
    with pytest.raises(FIError, match="bad input"):  # --overwrite never touches the old run before it is complete
        _nearfar(tiny, docs[:1], out, overwrite=True)
    assert _snapshot(out) == before


def test_interrupt_while_saving_the_first_unit_leaves_nothing(tiny, docs, tmp_path, monkeypatch):
    out = tmp_path / "new"
    run = ResumableRun(out, "nearfar", {"prefix": P})
    from fi_toolkit.runs import results

    original = results.write_json

    def interrupted(path, data):
        if path.name == "done.json":
            raise KeyboardInterrupt
        return original(path, data)

    monkeypatch.setattr("fi_toolkit.runs.results.write_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.run(docs[:1], lambda doc: {"t": pd.DataFrame({"a": [1, 2]})})
    assert not out.exists()


def test_typed_keeps_text_as_text_and_numbers_exact():
    """runs.resumable.typed: a column is a number only where every cell is that number as pandas writes
    it; identifiers and answers stay text; floats come back bit for bit (checked against repr)."""
    import io

    import numpy as np

    from fi_toolkit.runs.resumable import TEXT_COLUMNS, read_table

    floats = np.random.default_rng(3).standard_normal(50) * 10.0 ** np.arange(-25, 25)
    table = pd.DataFrame(
        {
            "document": ["12"] * 50,  # an identifier that looks like a number
            "answer": [" 100.", "007", "3498605.", "1e3", "-0"] * 10,
            "label": ["007"] + ["7"] * 49,  # not a text column, yet "007" is no number
            "x": floats,
            "n": [10] * 49 + [None],  # integers with a blank: pandas' float64
            "flag": [True, False] * 25,
        }
    )
    csv = table.to_csv(index=False)
    back = read_table(io.StringIO(csv))
    assert "document" in TEXT_COLUMNS and list(back["document"]) == ["12"] * 50
    assert list(back["answer"]) == list(table["answer"]) and list(back["label"]) == list(table["label"])
    assert [repr(v) for v in back["x"]] == [repr(float(v)) for v in floats]
    assert back["n"].dtype == np.float64 and back["n"].iloc[0] == 10 and np.isnan(back["n"].iloc[-1])
    assert back["flag"].dtype == bool
    assert back.to_csv(index=False) == csv  # read and written again: the same bytes


def test_parts_written_with_and_without_decimals_merge_to_one_number_type(tmp_path):
    """One unit writes n_removed as 10 (integers), another as 10.0 (beside a blank): the merge decides the
    column's type over both, so it is numeric (float64, as pandas reads the whole) and not text."""
    from fi_toolkit.runs.resumable import ResumableRun

    class Unit:
        def __init__(self, name):
            self.name, self.sha256 = name, name

        def __len__(self):
            return 1

    values = {"u0": [10, 12], "u1": [10.0, None]}
    run = ResumableRun(tmp_path / "run", "nearfar", {})
    tables = run.run([Unit("u0"), Unit("u1")], lambda u: {"t": pd.DataFrame({"document": u.name, "n": values[u.name]})})
    assert tables["t"]["n"].dtype == "float64"
    assert tables["t"]["n"].tolist()[:3] == [10.0, 12.0, 10.0]
    assert list(tables["t"]["document"]) == ["u0", "u0", "u1", "u1"]
