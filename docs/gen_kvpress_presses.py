"""Write docs/reference/kvpress-presses.md: every press class of the installed kvpress, measured through the
bridge or refused with the reason (:func:`fi_toolkit.integrations.kvpress.catalog.press_survey`).

kvpress lives in its own virtualenv (it pins transformers < 5.3), so ``make docs`` (in .venv) does not run
this; the generated page is committed, and tests/test_kvpress_pipeline.py (``make test-kvpress``) checks that it is
what the installed kvpress gives:

    .venv-kvpress/bin/python docs/gen_kvpress_presses.py            # writes the page
    .venv-kvpress/bin/python docs/gen_kvpress_presses.py --check    # exit 1 if the committed page differs
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "reference" / "kvpress-presses.md"
PREFIX, RATIO = 256, 0.75  # the survey's setting: SmolLM2, the first 256 tokens of alice, kvpress's ratio 0.75

KIND_ORDER = ("scorer", "wrapper", "after the prefill", "other", "decoding")


def _cell(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return text.replace("|", "\\|")


def render(outcomes, kvpress_version: str, transformers_version: str) -> str:
    measured = [o for o in outcomes if o.measured]
    lines = [
        "# kvpress presses: measured or refused",
        "",
        f"Every press class kvpress {kvpress_version} exports (transformers {transformers_version}), run through the",
        "bridge (`fi_toolkit/integrations/kvpress/bridge.py`) on the first 256 tokens of *Alice* with the embedded",
        f"SmolLM2-135M at `remove={RATIO}` (kvpress's `compression_ratio`): **{len(measured)} measured, "
        f"{len(outcomes) - len(measured)} refused**, each refusal with its reason. A measured press is an eviction",
        "that `fi probe --select kvpress:SPEC` and the near/far study measure (the spec below is the one tried;",
        "wrappers wrap `SnapKVPress`). Written by `docs/gen_kvpress_presses.py` in `.venv-kvpress`;",
        "`make test-kvpress` checks that it is current.",
        "",
        "| press | kind | spec tried | `fi probe`, near/far | kept of 256 (mean per layer and KV head) "
        "| `fi eval` compresses |",
        "|---|---|---|---|---:|---|",
    ]
    ordered = sorted(outcomes, key=lambda o: (KIND_ORDER.index(o.kind), o.name))
    for o in ordered:
        spec = f"`kvpress:{_cell(o.spec)}`" if o.spec else ""
        status = "measured" if o.measured else f"refused: {_cell(o.reason)}"
        kept = f"{o.kept:.1f}" if o.kept is not None else ""
        use = o.decoding if o.measured or o.kind == "decoding" else ""
        lines.append(f"| `{o.name}` | {o.kind} | {spec} | {status} | {kept} | {use} |")
    lines += [
        "",
        "Kinds: *scorer*, a `ScorerPress` (scores entries, keeps the top ones per layer and KV head); *wrapper*, a",
        "press around another (per-head or per-layer budgets, chunks, blocks, two stages); *after the prefill*,",
        "KVzip and its kin, which score each entry by replaying the context through the model once the prefill is",
        "done and mask entries per layer and head; *decoding*, presses that compress only while tokens are",
        "generated. In `fi eval --policy kvpress:NAME --interval N` a `ScorerPress` compresses the prompt with",
        "kvpress's prefill, then back to the budget at every interval with its own `compress` on what kvpress's",
        "`DecodingPress` gives it; any other press compresses the prompt only, as kvpress applies it. How the",
        "bridge reads what a press kept, and why a press is refused: [kvpress](../guides/kvpress.md).",
        "",
    ]
    return "\n".join(lines)


def survey(lm=None) -> list:
    """Every press of the installed kvpress on the survey's prefix (``lm``: the embedded SmolLM2, loaded here
    if not given)."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.integrations.kvpress.catalog import press_survey
    from fi_toolkit.model.loading import load_model

    torch.manual_seed(0)  # RandomPress draws from torch's generator
    lm = lm or load_model("smollm2-135m")
    doc = load_document("alice", lm.tokenizer, max_tokens=PREFIX)
    outcomes = press_survey(lm.model, doc.ids, PREFIX, RATIO)
    path = str(lm.model.config.name_or_path)  # a local cache directory: the same page on every machine
    for o in outcomes:
        o.reason = o.reason.replace(path, "SMOLLM2_DIR").replace(path.replace("/", "_"), "SMOLLM2_DIR")
    return outcomes


def survey_page(outcomes) -> str:
    from importlib.metadata import version

    return render(outcomes, version("kvpress"), version("transformers"))


def main() -> int:
    text = survey_page(survey())
    if "--check" in sys.argv[1:]:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is not current: run python docs/gen_kvpress_presses.py in .venv-kvpress", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
