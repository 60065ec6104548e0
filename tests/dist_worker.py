"""One rank of a sharded run of the tiny model (run by tests/test_distributed.py under torchrun, or
alone as the single-process reference): ``python dist_worker.py OUT STUDIES [--kill RANK:N] [--resume|--overwrite]``.

STUDIES is a comma-separated subset of nearfar, parts (nearfar with documents split into parts),
correlate, cparts (correlate in blocks of candidates), eval, eparts (eval of three policies, whole
documents in eval3 and parts of 2 replays in eparts), single (a nearfar run of one document: idle ranks); each writes
OUT/<study>. ``--kill RANK:N``: rank RANK kills itself (SIGKILL, no clean-up)
when it starts its N-th nearfar unit, in the first launch only (not after a torchrun restart).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

from fi_toolkit import Document, SignalConfig
from fi_toolkit.compress.decoder import signal_config_for
from fi_toolkit.evaluation import TextSetting, run_eval_text
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.policies import make_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.studies import CorrelateSettings, NearfarSettings, run_correlate, run_nearfar, study

P, CFG = 96, SignalConfig(window=8)
LENGTHS = [400, 150, 160, 170, 180]  # one long document: cost balancing gives it a rank to itself


def documents():
    gen = torch.Generator().manual_seed(11)
    return [
        Document(f"doc {i}", f"text {i}", torch.randint(0, 256, (n,), generator=gen), "test")
        for i, n in enumerate(LENGTHS)
    ]


def run(out: Path, studies: list[str], resume: bool = False, overwrite: bool = False) -> None:
    """``overwrite``: the nearfar study replaces what OUT/nearfar holds."""
    tiny, docs = tiny_model(seed=0), documents()
    if "nearfar" in studies:
        run_nearfar(
            tiny,
            docs,
            NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=2, signals=CFG),
            RunSettings(out / "nearfar", resume=resume, overwrite=overwrite),
        )
    if "parts" in studies:  # nearfar with every document split into units of 3 sets
        run_nearfar(
            tiny,
            docs,
            NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=2, signals=CFG, unit_sets=3),
            RunSettings(out / "parts", resume=resume),
        )
    if "single" in studies:
        run_nearfar(
            tiny,
            docs[1:2],
            NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=1, signals=CFG),
            RunSettings(out / "single", resume=resume),
        )
    if "correlate" in studies:
        run_correlate(
            tiny,
            docs,
            CorrelateSettings([Chunk(P, P + 16)], P, candidates="sample:6", resamples=20, signals=CFG),
            RunSettings(out / "correlate", resume=resume),
        )
    if "cparts" in studies:  # correlate with every document split into blocks of 4 candidates
        run_correlate(
            tiny,
            docs,
            CorrelateSettings(
                [Chunk(P, P + 16)], P, candidates="sample:6", resamples=20, signals=CFG, unit_candidates=4
            ),
            RunSettings(out / "cparts", resume=resume),
        )
    if "eval" in studies:
        policies = [make_policy("snapkv", budget=0.4, window=16)]
        setting = TextSetting(prompt=P, length=144, interval=32, free_tokens=4)
        run_eval_text(
            tiny, docs, out / "eval", policies, setting, signal_config_for(policies[0]), resume=resume, n_resamples=20
        )
    if "eparts" in studies:  # eval with every document split into parts of 2 replays (full cache, 3 policies)
        policies = [make_policy(n, budget=0.4, window=16) for n in ("snapkv", "streaming", "infokv")]
        setting = TextSetting(prompt=P, length=144, interval=32, free_tokens=4)
        for name, split in (("eval3", 0), ("eparts", 2)):
            run_eval_text(
                tiny,
                docs,
                out / name,
                policies,
                setting,
                signal_config_for(policies[0]),
                resume=resume,
                n_resamples=20,
                unit_policies=split,
            )


def main(argv: list[str]) -> None:
    out, studies = Path(argv[0]), argv[1].split(",")
    if "--kill" in argv:
        rank, n = (int(v) for v in argv[argv.index("--kill") + 1].split(":"))
        started = []
        original = study.nearfar_document

        def dying(*args, **kwargs):
            started.append(1)
            first_launch = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            if first_launch and int(os.environ.get("RANK", 0)) == rank and len(started) == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        study.nearfar_document = dying
    run(out, studies, resume="--resume" in argv, overwrite="--overwrite" in argv)


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("FI_WORKER_TIMEOUT", "240")), exit=True)  # never hang a test
    torch.set_num_threads(1)
    main(sys.argv[1:])
