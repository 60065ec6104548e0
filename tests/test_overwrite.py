"""``--overwrite`` of a resumable run (fi nearfar, fi correlate, fi eval) never touches the old results until
the new run is complete: interrupted at any point, the old run directory is byte for byte what it was (the
user's own file in it included); ``--resume`` then finishes the overwrite from its staging directory,
computing only what is missing, and the result equals an uninterrupted run into an empty directory.

The tiny random model and random documents, as in tests/test_resume.py; each run takes a fraction of a second.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from cli_runner import run_cli

from fi_toolkit import Document, SignalConfig
from fi_toolkit.compress.decoder import signal_config_for
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation import TextSetting, run_eval_text
from fi_toolkit.policies import make_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.runs import results
from fi_toolkit.runs.resumable import overwrite_staging
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.studies import CorrelateSettings, NearfarSettings, read_table, run_correlate, run_nearfar, study

CFG = SignalConfig(window=8)
P = 96
NEARFAR = ["nearfar", "token_classes", "nearfar_summary", "nearfar_tests", "token_class_summary"]


@pytest.fixture(scope="module")
def docs():
    gen = torch.Generator().manual_seed(5)
    return [Document(f"doc {i}", f"text {i}", torch.randint(0, 256, (200,), generator=gen), "test") for i in range(3)]


def _old(tiny, docs, out, resume=False, overwrite=False):
    """The run an overwrite replaces: three documents, one seed."""
    settings = NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=1, signals=CFG)
    return run_nearfar(tiny, docs, settings, RunSettings(out, resume, overwrite))


def _new(tiny, docs, out, resume=False, overwrite=False):
    """The overwrite: two of the documents, two seeds (its FI tables differ from the old run's)."""
    settings = NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=2, signals=CFG)
    return run_nearfar(tiny, docs[:2], settings, RunSettings(out, resume, overwrite))


def _tree(root):
    """Every entry under ``root`` -> its bytes (None for a directory)."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


class Counter:
    """Wraps nearfar_document: records the documents it is called for, raises KeyboardInterrupt on call ``stop_at``."""

    def __init__(self, fn, stop_at=None):
        self.fn, self.stop_at, self.calls = fn, stop_at, []

    def __call__(self, model, doc, *args, **kwargs):
        self.calls.append(doc.name)
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        return self.fn(model, doc, *args, **kwargs)


@pytest.fixture(scope="module")
def fresh(tiny, docs, tmp_path_factory):
    """The overwrite's settings, run uninterrupted into an empty directory: what a finished overwrite must equal."""
    out = tmp_path_factory.mktemp("fresh") / "run"
    _new(tiny, docs, out)
    return out


@pytest.fixture
def old_run(tiny, docs, tmp_path):
    """A finished old run with a file of the user's own in it -> (its directory, its bytes)."""
    out = tmp_path / "out"
    _old(tiny, docs, out)
    (out / "notes.txt").write_text("mine\n")
    return out, _tree(out)


def _interrupt_write(monkeypatch, module_function, name):
    """Make ``results.<module_function>`` raise KeyboardInterrupt when it writes the file ``name`` of the
    staging directory itself (not a per-document file)."""
    original = getattr(results, module_function)

    def interrupted(path, *args, **kwargs):
        if path.name == name and path.parent.name == ".out.overwrite":
            raise KeyboardInterrupt
        return original(path, *args, **kwargs)

    monkeypatch.setattr(results, module_function, interrupted)


def _interrupt_rename_into_place(monkeypatch):
    """os.replace raises KeyboardInterrupt when the staging directory is renamed onto --out (the old one is aside)."""
    original = os.replace

    def replace(src, dst):
        if os.path.basename(src) == ".out.overwrite":
            raise KeyboardInterrupt
        return original(src, dst)

    monkeypatch.setattr(results.os, "replace", replace)


def _interrupt_carry(monkeypatch):
    """The user's file is carried into the staging directory, then Ctrl-C."""
    original = results._carry

    def carry(src, dst):
        original(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "_carry", carry)


# where the overwrite is interrupted -> how many of its units are saved in its staging directory by then
POINTS = {
    "computing document 1": (lambda m: m.setattr(study, "nearfar_document", Counter(study.nearfar_document, 1)), 0),
    "computing document 2": (lambda m: m.setattr(study, "nearfar_document", Counter(study.nearfar_document, 2)), 1),
    "merging the tables": (lambda m: _interrupt_write(m, "write_table", "nearfar.csv"), 2),
    "writing the summaries": (lambda m: _interrupt_write(m, "write_table", "nearfar_tests.csv"), 2),
    "writing the manifest": (lambda m: _interrupt_write(m, "write_json", "manifest.json"), 2),
    "carrying the user's file": (_interrupt_carry, 2),
    "between the renames": (_interrupt_rename_into_place, 2),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_an_interrupted_overwrite_leaves_the_old_run_whole_and_resumes(
    point, old_run, fresh, tiny, docs, tmp_path, monkeypatch
):
    out, old = old_run
    staging = tmp_path / ".out.overwrite"
    interrupt, saved = POINTS[point]
    with monkeypatch.context() as m:
        interrupt(m)
        with pytest.raises(KeyboardInterrupt):
            _new(tiny, docs, out, overwrite=True)
    assert _tree(out) == old  # byte for byte, the user's file included
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if saved == 0 else [".out.overwrite", "out"])
    if saved == 0:  # nothing of the overwrite was saved: --resume would continue the old run, whose settings differ
        with pytest.raises(FIError, match="cannot resume .* with different settings"):
            _new(tiny, docs, out, resume=True)
        return
    assert len(list(staging.glob("per_document/*/done.json"))) == saved
    assert not (staging / "notes.txt").exists()  # what was carried is taken out again

    with pytest.raises(FIError, match=r"holds an interrupted overwrite of .*pass resume to finish it or overwrite"):
        _new(tiny, docs, out)  # neither resume nor overwrite: refused, nothing touched
    with pytest.raises(FIError, match=r"cannot resume '.*\.out\.overwrite' with different settings"):
        _old(tiny, docs, out, resume=True)  # --resume continues the overwrite, not the old run
    assert _tree(out) == old

    resumed = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", resumed)
    _new(tiny, docs, out, resume=True)
    assert resumed.calls == ["doc 0", "doc 1"][saved:]  # only what the overwrite had not saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or aside directory left
    for name in NEARFAR:
        assert (out / f"{name}.csv").read_bytes() == (fresh / f"{name}.csv").read_bytes(), name
    assert (out / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in (out / "per_document").iterdir()) == ["doc_0", "doc_1"]  # the old doc_2 is gone
    assert json.loads((out / "settings.json").read_text())["settings"]["seeds"] == 2


def test_a_completed_overwrite_replaces_the_old_run(old_run, fresh, tiny, docs, tmp_path):
    out, old = old_run
    _new(tiny, docs, out, overwrite=True)
    new = _tree(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert new["notes.txt"] == b"mine\n"
    for name in NEARFAR:
        assert new[f"{name}.csv"] == (fresh / f"{name}.csv").read_bytes(), name
    assert new["nearfar.csv"] != old["nearfar.csv"] and new["nearfar_summary.csv"] != old["nearfar_summary.csv"]
    assert not any(k.startswith("per_document/doc_2") for k in new)  # the old run's third document is not mixed in
    old_units = {k for k in old if k.startswith("unit_log/")}
    assert old_units and not old_units & set(new)  # the old run's unit log went with it
    manifest = json.loads(new["manifest.json"])
    assert manifest["computed_this_session"] == ["doc 0", "doc 1"]


def test_overwrite_again_starts_the_interrupted_overwrite_over(old_run, fresh, tiny, docs, tmp_path, monkeypatch):
    out, old = old_run
    with monkeypatch.context() as m:
        m.setattr(study, "nearfar_document", Counter(study.nearfar_document, 2))
        with pytest.raises(KeyboardInterrupt):
            _new(tiny, docs, out, overwrite=True)
    assert (tmp_path / ".out.overwrite" / "per_document" / "doc_0" / "done.json").is_file()
    again = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", again)
    _new(tiny, docs, out, overwrite=True)
    assert again.calls == ["doc 0", "doc 1"]  # the staged unit is not reused: overwrite starts over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    for name in NEARFAR:
        assert (out / f"{name}.csv").read_bytes() == (fresh / f"{name}.csv").read_bytes(), name


def test_an_overwrite_that_fails_before_its_first_unit_leaves_an_earlier_staging_alone(
    old_run, tiny, docs, tmp_path, monkeypatch
):
    """An overwrite that stops before it saves anything (bad input found while computing) has not started over:
    the earlier interrupted overwrite is still there to resume."""
    out, old = old_run
    with monkeypatch.context() as m:
        m.setattr(study, "nearfar_document", Counter(study.nearfar_document, 2))
        with pytest.raises(KeyboardInterrupt):
            _new(tiny, docs, out, overwrite=True)
    staged = _tree(tmp_path / ".out.overwrite")

    def fail(*args, **kwargs):
        raise FIError("bad input found while computing")

    monkeypatch.setattr(study, "nearfar_document", fail)
    with pytest.raises(FIError, match="bad input"):
        _new(tiny, docs, out, overwrite=True)
    assert _tree(out) == old and _tree(tmp_path / ".out.overwrite") == staged


def test_overwrite_of_an_empty_directory_writes_in_place(tiny, docs, tmp_path):
    """Nothing to keep: --overwrite of a directory without results (or of none) writes there directly."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    _new(tiny, docs, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "manifest.json").is_file()


def test_staging_directory_name():
    assert overwrite_staging("runs/nf") == overwrite_staging(os.path.abspath("runs/nf"))
    assert (
        overwrite_staging("runs/nf").name == ".nf.overwrite" and overwrite_staging("runs/nf/").name == ".nf.overwrite"
    )


def test_cli_refuses_a_plain_run_beside_an_interrupted_overwrite(tmp_path, monkeypatch, capsys):
    """Before the model: one line, exit 2, naming the staging directory and both ways on."""

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("fi_toolkit.model.loading.load_model", load_model)
    out, staging = tmp_path / "run", tmp_path / ".run.overwrite"
    for d in (out, staging):
        (d / "per_document").mkdir(parents=True)
        (d / "settings.json").write_text(json.dumps({"command": "nearfar", "settings": {"seeds": 1}}))
    before = _tree(tmp_path)
    code, _, err = run_cli(["nearfar", "alice", "--out", str(out)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == (
        f"error: '{staging}' holds an interrupted --overwrite of '{out}' (whose results are intact); pass --resume "
        "to finish it or --overwrite to start it over"
    )
    code, _, err = run_cli(["correlate", "alice", "--chunk", "128:160", "--out", str(out), "--resume"], capsys)
    assert code == 2 and err.strip() == (
        f"error: cannot resume: '{staging}' holds a 'nearfar' run, not 'correlate' (--resume only continues the "
        "same command)"
    )
    assert _tree(tmp_path) == before


# ---- the other resumable commands: the same staging ---------------------------------------------------------


def _interrupt_second_unit(monkeypatch, module, name):
    """``module.name`` raises KeyboardInterrupt on its second call (the first unit is saved)."""
    original, calls = getattr(module, name), []

    def second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, second)


def _correlate(tiny, docs, out, candidates, resume=False, overwrite=False):
    settings = CorrelateSettings([Chunk(P, P + 16)], P, candidates, resamples=20, signals=CFG)
    return run_correlate(tiny, docs[:2], settings, RunSettings(out, resume, overwrite))


def _eval(tiny, docs, out, budget, **kw):
    policies = [make_policy("snapkv", budget=budget, window=16)]
    setting = TextSetting(prompt=P, length=144, interval=32, free_tokens=4)
    return run_eval_text(tiny, docs[:2], out, policies, setting, signal_config_for(policies[0]), n_resamples=20, **kw)


COMMANDS = {  # command -> run(model, documents, out, new: the overwrite's settings or the old run's, **kw)
    "correlate": lambda t, d, o, new, **kw: _correlate(t, d, o, "sample:5" if new else "sample:4", **kw),
    "eval": lambda t, d, o, new, **kw: _eval(t, d, o, 0.5 if new else 0.3, **kw),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_other_commands_keep_the_old_run_through_an_interrupted_overwrite(command, tiny, docs, tmp_path, monkeypatch):
    import fi_toolkit.evaluation.run as eval_run

    run = COMMANDS[command]
    module, name = (study, "correlate_document") if command == "correlate" else (eval_run, "evaluate_text")
    reference = run(tiny, docs, tmp_path / "reference", True)
    out = tmp_path / "out"
    run(tiny, docs, out, False)
    old = _tree(out)
    with monkeypatch.context() as m:
        _interrupt_second_unit(m, module, name)
        with pytest.raises(KeyboardInterrupt):
            run(tiny, docs, out, True, overwrite=True)
    assert _tree(out) == old
    assert len(list((tmp_path / ".out.overwrite").glob("per_document/*/done.json"))) == 1
    resumed = run(tiny, docs, out, True, resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "reference"]
    assert json.loads((out / "manifest.json").read_text())["computed_this_session"] == ["doc 1"]
    for table, frame in reference.items():
        written = read_table(out / f"{table}.csv")
        pd.testing.assert_frame_equal(
            written.drop(columns=["seconds"], errors="ignore"), frame.drop(columns=["seconds"], errors="ignore")
        )
        pd.testing.assert_frame_equal(resumed[table], written)


# ---- where the new run is staged ---------------------------------------------------------------------------


def _parent_unwritable(monkeypatch, parent):
    """tempfile.mkdtemp in ``parent`` fails as on a directory without write permission (root passes chmod)."""
    original = results.tempfile.mkdtemp

    def mkdtemp(*args, dir=None, **kwargs):
        if dir is not None and os.path.realpath(dir) == os.path.realpath(parent):
            raise PermissionError(13, "Permission denied")
        return original(*args, dir=dir, **kwargs)

    monkeypatch.setattr(results.tempfile, "mkdtemp", mkdtemp)


def test_overwrite_is_refused_before_any_work_where_nothing_can_be_staged(old_run, tiny, docs, tmp_path, monkeypatch):
    """--overwrite of a run whose directory lies in an unwritable directory: the new run could never be swapped
    in, so it is refused before the first unit is computed, naming that directory; the old run stays."""
    out, old = old_run
    counter = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", counter)
    _parent_unwritable(monkeypatch, tmp_path)
    with pytest.raises(FIError, match=rf"out_dir '{out}' cannot be replaced: .* '{tmp_path}' cannot be written: Perm"):
        _new(tiny, docs, out, overwrite=True)
    assert counter.calls == [] and _tree(out) == old


def test_cli_probe_overwrite_is_refused_before_the_model_where_nothing_can_be_staged(tmp_path, monkeypatch, capsys):
    """The same for a staged command that is not resumable (fi probe): one line, exit 2, the model never loaded."""

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("fi_toolkit.model.loading.load_model", load_model)
    out = tmp_path / "probe"
    out.mkdir()
    (out / "fi.csv").write_text("selection,fi\nentropy:0.1,0.5\n")
    _parent_unwritable(monkeypatch, tmp_path)
    code, _, err = run_cli(["probe", "alice", "--chunk", "128:160", "--out", str(out), "--overwrite"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: --out '{out}' cannot be replaced: its new contents are written beside it first, and '{tmp_path}' "
        "cannot be written: Permission denied"
    ]


def test_overwrite_through_a_link_replaces_the_linked_directory(old_run, fresh, tiny, docs, tmp_path, monkeypatch):
    """--out a link to the old run's directory: interrupted, nothing changes; finished, the link is still a link
    and the directory it names holds the new run; nothing is left beside either."""
    out, old = old_run
    link = tmp_path / "link"
    link.symlink_to(out)
    with monkeypatch.context() as m:
        m.setattr(study, "nearfar_document", Counter(study.nearfar_document, 2))
        with pytest.raises(KeyboardInterrupt):
            _new(tiny, docs, link, overwrite=True)
    assert _tree(out) == old and (tmp_path / ".out.overwrite").is_dir()  # staged beside the directory itself
    _new(tiny, docs, link, resume=True)
    assert link.is_symlink() and os.readlink(link) == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "out"]
    for name in NEARFAR:
        assert (out / f"{name}.csv").read_bytes() == (fresh / f"{name}.csv").read_bytes(), name
    assert (out / "notes.txt").read_text() == "mine\n"


# ---- the command line, end to end ----------------------------------------------------------------------------


class Bytes:
    """One token per character (ids < 256): the tiny random model reads the CLI's documents."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [ord(c) % 256 for c in text]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)


def test_cli_nearfar_overwrite_interrupted_then_resumed(tiny, tmp_path, monkeypatch, capsys):
    """``fi nearfar --overwrite`` stopped by Ctrl-C after its first document: exit 130, the old run byte for
    byte; a plain run is refused in one line; ``--resume`` says it finishes the overwrite, computes the second
    document only, and --out then holds the new run."""
    from fi_toolkit.model.loading import LoadedModel

    lm = LoadedModel(tiny.model, Bytes(), "tiny", torch.device("cpu"), torch.float32)
    monkeypatch.setattr("fi_toolkit.model.loading.load_model", lambda *args, **kwargs: lm)
    gen = torch.Generator().manual_seed(3)
    for name in ("a", "b"):
        letters = torch.randint(97, 123, (300,), generator=gen).tolist()
        (tmp_path / f"{name}.txt").write_text("".join(map(chr, letters)))
    args = ["nearfar", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--prefix", "96", "--distances", "0,32"]
    args += ["--chunk-len", "16", "--window", "8", "--out", str(tmp_path / "run")]
    code, _, err = run_cli([*args, "--seeds", "1"], capsys)
    assert code == 0, err
    old = _tree(tmp_path / "run")

    with monkeypatch.context() as m:
        m.setattr(study, "nearfar_document", Counter(study.nearfar_document, 2))
        code, _, err = run_cli([*args, "--seeds", "2", "--overwrite"], capsys)
    assert code == 130 and err.strip().splitlines()[-1].startswith("interrupted"), err
    assert _tree(tmp_path / "run") == old
    code, _, err = run_cli([*args, "--seeds", "2"], capsys)
    assert code == 2 and "holds an interrupted --overwrite" in err and len(err.strip().splitlines()) == 1, err

    resumed = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", resumed)
    code, _, err = run_cli([*args, "--seeds", "2", "--resume"], capsys)
    assert code == 0, err
    assert f"note: resuming the interrupted overwrite in '{tmp_path / '.run.overwrite'}'" in err
    assert resumed.calls == ["b"]
    assert not (tmp_path / ".run.overwrite").exists()
    assert json.loads((tmp_path / "run" / "settings.json").read_text())["settings"]["seeds"] == 2
    assert (tmp_path / "run" / "nearfar.csv").read_bytes() != old["nearfar.csv"]
