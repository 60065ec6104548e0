"""A subset of a ``fi labels`` run as a run of its own (hard links, nothing recomputed): every text's first slice,
in the order of its kind in turn (dialogue, verse, prose, code...), so the first ``N`` slices of the subset span
every kind of the corpus. The learning curves of ``analyses/surrogate.py --curve`` read it in that order.

    python analyses/label_subset.py runs/labels-all runs/labels-round1

Its ``manifest.json`` lists the units in that order and says what the subset is; the units keep the ``done.json``
(and so the checksums) their run wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from itertools import zip_longest
from pathlib import Path

from fi_toolkit.surrogate.corpus import MANIFEST


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a fi labels run (finished or not)")
    ap.add_argument("out", type=Path, help="the subset's run directory (must not exist)")
    args = ap.parse_args(argv)
    kinds: dict[str, list[str]] = {}
    for text in json.loads(Path(MANIFEST).read_text())["texts"]:
        kinds.setdefault(text["kind"], []).append(text["title"])
    units = {}  # "title#0@p512" -> unit key
    for done in sorted((args.run / "per_document").glob("*/done.json")):
        units[json.loads(done.read_text())["document"]] = done.parent.name
    order = []
    for turn in zip_longest(*kinds.values()):
        for title in (t for t in turn if t is not None):
            points = sorted((int(d.rsplit("@p", 1)[1]), d) for d in units if d.startswith(f"{title}#0@"))
            order += [units[d] for _, d in points]
    (args.out / "per_document").mkdir(parents=True)
    shutil.copy(args.run / "settings.json", args.out / "settings.json")
    for key in order:
        shutil.copytree(args.run / "per_document" / key, args.out / "per_document" / key, copy_function=os.link)
    manifest = {
        "command": "labels",
        "units": [{"unit": key} for key in order],
        "subset_of": str(args.run),
        "note": "every text's first slice, its kind in turn: " + ", ".join(kinds),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(order)} units of {len(order) // 2 if order else 0} texts into {args.out}")


if __name__ == "__main__":
    main()
