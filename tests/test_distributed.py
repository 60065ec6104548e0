"""Sharded runs under torchrun: the plan, the merged tables against a single process, a
rank killed mid-run, resumed with one rank or restarted by torchrun, and CPU threads per rank.

The torchrun tests launch ``tests/dist_worker.py`` (the tiny model through the library) with two gloo
ranks; the single-process reference is computed here, in this process, by the unsharded code path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dist_worker
import pandas as pd
import pytest
import torch

from fi_toolkit.runs import distributed
from fi_toolkit.studies import read_table

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ["nearfar", "parts", "correlate", "cparts", "eval", "eparts", "single"]
SAME_AS = {
    "parts": "nearfar",
    "cparts": "correlate",
    "eparts": "eval3",
}  # split into parts on two ranks: the tables of the unsplit single process
TIMINGS = {"replays.csv": ["seconds"]}  # the only columns that hold wall-clock time


def torchrun(args, nproc=2, restarts=0, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "FI_WORKER_TIMEOUT": "240"}
    if restarts:  # restarted ranks otherwise may read the first attempt's gloo addresses (pytorch#135712, #167288)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(restarts),
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def worker(*args, **kwargs):
    return torchrun([str(ROOT / "tests" / "dist_worker.py"), *map(str, args)], **kwargs)


def assert_same_tables(a: Path, b: Path) -> None:
    names = sorted(f.name for f in a.glob("*.csv"))
    assert names and names == sorted(f.name for f in b.glob("*.csv"))
    for name in names:
        if name in TIMINGS:
            pd.testing.assert_frame_equal(
                read_table(a / name).drop(columns=TIMINGS[name]), read_table(b / name).drop(columns=TIMINGS[name])
            )
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def computed(run: Path) -> Counter:
    """How many times each unit was computed, over every session and rank (the manifest's unit log)."""
    return Counter(e["unit"] for e in json.loads((run / "manifest.json").read_text())["unit_log"])


# ---- the plan ---------------------------------------------------------------------------------------------


def test_assignment_is_deterministic_and_balanced_by_cost():
    assert distributed.assign([8, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0] + [1] * 8  # round-robin would give 4 + 8 vs 4
    costs = [400, 150, 160, 170, 180]
    owner = distributed.assign(costs, 2)
    assert owner == distributed.assign(costs, 2) == [0, 0, 1, 1, 1]
    loads = [sum(c for c, r in zip(costs, owner) if r == k) for k in range(2)]
    assert max(loads) <= sum(costs) / 2 + max(costs)  # LPT bound
    assert distributed.assign([5, 5], 4) == [0, 1]  # idle ranks 2 and 3
    assert distributed.assign([], 3) == []


def test_parts_of_a_document_stay_together():
    # five documents of two equal parts on two ranks: consecutive runs, only the middle document split
    assert distributed.assign([1] * 10, 2, [d for d in range(5) for _ in range(2)]) == [0] * 5 + [1] * 5
    # the longest document's parts first; every rank within one unit of the mean load
    costs, groups = [1, 1, 3, 3, 3, 2, 2], ["a", "a", "b", "b", "b", "c", "c"]
    owner = distributed.assign(costs, 3, groups)
    assert owner == distributed.assign(costs, 3, groups) == [2, 2, 0, 0, 1, 1, 2]
    loads = [sum(c for c, r in zip(costs, owner) if r == k) for k in range(3)]
    assert max(loads) <= sum(costs) / 3 + max(costs)
    assert distributed.assign([4, 1], 2, ["x", "y"]) == distributed.assign([4, 1], 2)  # one unit per group: LPT


def test_threads_and_devices_per_rank(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert distributed.divide_threads(distributed.World(size=2, local_size=2), cores=2) == 1
        torch.set_num_threads(8)
        assert distributed.divide_threads(distributed.World(size=4, local_size=2), cores=8) == 4
        assert distributed.divide_threads(distributed.World(size=16, local_size=16), cores=8) == 1
    finally:
        torch.set_num_threads(before)
    rank3 = distributed.World(rank=3, size=4, local_rank=3, local_size=4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert distributed.rank_device("cuda", rank3) == "cuda:3"
    assert distributed.rank_device("auto", rank3) == "cuda:3"
    assert distributed.rank_device("cuda:1", rank3) == "cuda:1"  # an explicit device is the user's
    assert distributed.rank_device("cuda", distributed.World()) == "cuda"  # one process: as before
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.rank_device("auto", rank3) == "cpu"


def test_world_from_torchrun_environment(monkeypatch):
    for k, v in {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }.items():
        monkeypatch.setenv(k, v)
    w = distributed.from_env()
    assert (w.rank, w.size, w.local_rank, w.local_size, w.restart, w.main, w.sharded) == (5, 8, 1, 4, 2, False, True)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(k)
    assert distributed.from_env() == distributed.World()


# ---- two gloo ranks against one process ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    dist_worker.run(out, STUDIES)  # this process: world size 1, the unsharded path
    return out


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    done = worker(out, ",".join(STUDIES))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stderr


@pytest.mark.torchrun
@pytest.mark.parametrize("name", STUDIES)
def test_two_ranks_merge_to_the_single_process_tables(single, sharded, name):
    out, _ = sharded
    assert_same_tables(single / SAME_AS.get(name, name), out / name)
    assert_same_tables(single / name, out / name)
    manifest = json.loads((out / name / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and json.loads((single / name / "manifest.json").read_text())["world_size"] == 1
    units = manifest["units"]
    assert sorted(u["unit"] for u in units) == sorted(p.name for p in (out / name / "per_document").iterdir())
    if name == "parts":  # 4 parts of 3 sets per document; consecutive runs: one document on both ranks
        assert len(units) == 20 and units[0]["unit"] == "doc_0.part1of4"
        split = [d for d in range(5) if len({u["rank"] for u in units if u["unit"].startswith(f"doc_{d}.")}) > 1]
        assert len(split) == 1 and {u["rank"] for u in units} == {0, 1}
    elif name == "cparts":  # 6 candidates in blocks of 4: 2 parts per document
        assert len(units) == 10 and units[1]["unit"] == "doc_0.part2of2"
    elif name == "eparts":  # 4 replays in parts of 2
        assert len(units) == 10 and units[1]["unit"] == "doc_0.part2of2"
        assert_same_tables(single / "eval3", out / "eval3")
    elif name != "single":  # the long document alone on rank 0, the four short ones on rank 1... by cost
        assert [u["rank"] for u in units] == [0, 0, 1, 1, 1]
    assert set(computed(out / name).values()) == {1}
    assert manifest["computed_this_session"] == [u["document"] for u in units]


@pytest.mark.torchrun
def test_idle_ranks_say_so(sharded):
    _, stderr = sharded
    notes = [line for line in stderr.splitlines() if "has no unit to compute" in line]
    assert notes == [
        "note: rank 1 of 2 has no unit to compute (1 unit(s) to compute for 2 ranks); it waits for the others"
    ]


# ---- faults ---------------------------------------------------------------------------------------------------


@pytest.mark.torchrun
def test_killed_rank_resumes_with_one_rank(single, tmp_path):
    died = worker(tmp_path, "nearfar", "--kill", "1:2")  # rank 1 dies starting its second unit
    assert died.returncode != 0
    run = tmp_path / "nearfar"
    before = {p.parent.name for p in run.glob("per_document/*/done.json")}
    assert "doc_2" in before and "doc_3" not in before  # rank 1's first unit survived, its second is lost
    assert not (run / "manifest.json").exists()
    dist_worker.run(tmp_path, ["nearfar"], resume=True)  # one rank, this process
    assert_same_tables(single / "nearfar", run)
    log = json.loads((run / "manifest.json").read_text())["unit_log"]
    assert set(computed(run).values()) == {1}  # no unit computed twice
    assert {e["unit"] for e in log if e["world_size"] == 1} == {f"doc_{i}" for i in range(5)} - before
    assert {e["unit"] for e in log if e["world_size"] == 2} == before


@pytest.mark.torchrun
def test_torchrun_restart_continues_the_run(single, tmp_path):
    done = worker(tmp_path, "nearfar", "--kill", "1:2", restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "nearfar"
    assert_same_tables(single / "nearfar", run)
    log = json.loads((run / "manifest.json").read_text())["unit_log"]
    assert set(computed(run).values()) == {1} and len(log) == 5
    assert len({e["session"] for e in log}) == 2  # the first launch and the restart


def old_nearfar(out: Path) -> dict:
    """A finished nearfar run of other settings (one seed) in out/nearfar, with a file of the user's own
    -> every entry's bytes (None for a directory)."""
    from fi_toolkit.model.loading import tiny_model
    from fi_toolkit.studies import NearfarSettings, run_nearfar

    run = out / "nearfar"
    docs = dist_worker.documents()[:3]
    run_nearfar(
        tiny_model(seed=0), docs, NearfarSettings(dist_worker.P, [0, 32], 16, seeds=1, signals=dist_worker.CFG), run
    )
    (run / "notes.txt").write_text("mine\n")
    return tree(run)


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.torchrun
def test_killed_overwrite_keeps_the_old_run_and_resumes_with_one_rank(single, tmp_path):
    """torchrun --overwrite with a rank killed: the old run is untouched byte for byte; both ranks' units are
    in the one staging directory, and --resume in one process finishes it into the single-process tables."""
    old = old_nearfar(tmp_path)
    died = worker(tmp_path, "nearfar", "--overwrite", "--kill", "1:2")
    assert died.returncode != 0
    run, staging = tmp_path / "nearfar", tmp_path / ".nearfar.overwrite"
    assert tree(run) == old
    staged = {p.parent.name for p in staging.glob("per_document/*/done.json")}
    ranks = {json.loads(f.read_text())["computed_by"]["rank"] for f in staging.glob("per_document/*/done.json")}
    assert "doc_2" in staged and ranks == {0, 1}  # both ranks wrote into the same staging directory
    dist_worker.run(tmp_path, ["nearfar"], resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nearfar"]
    assert_same_tables(single / "nearfar", run)
    assert (run / "notes.txt").read_text() == "mine\n"
    assert set(computed(run).values()) == {1}  # the old run's unit log went with it; nothing computed twice


@pytest.mark.torchrun
def test_torchrun_restart_continues_the_overwrite(single, tmp_path):
    """An elastic restart of an --overwrite continues in its staging directory and swaps it in at the end."""
    old_nearfar(tmp_path)
    done = worker(tmp_path, "nearfar", "--overwrite", "--kill", "1:2", restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "nearfar"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nearfar"]
    assert_same_tables(single / "nearfar", run)
    log = json.loads((run / "manifest.json").read_text())["unit_log"]
    assert set(computed(run).values()) == {1} and len(log) == 5
    assert len({e["session"] for e in log}) == 2  # the first launch and the restart


# ---- models larger than one device: accelerate's dispatch hooks ------------------------------------------------


def layer_map(model) -> dict:
    """An explicit device map naming every module group of the tiny Llama (all on the CPU here)."""
    names = [
        "model.embed_tokens",
        *[f"model.layers.{i}" for i in range(len(model.model.layers))],
        "model.norm",
        "model.rotary_emb",
        "lm_head",
    ]
    return {n: "cpu" for n in names}


def test_explicit_device_map_gives_the_plain_model_fi(tiny, tmp_path):
    import copy

    from fi_toolkit.model.loading import dispatch
    from fi_toolkit.probe.chunks import Chunk
    from fi_toolkit.studies import CorrelateSettings, NearfarSettings, run_correlate, run_nearfar

    placed = dispatch(copy.deepcopy(tiny), layer_map(tiny.model))
    assert all(hasattr(layer, "_hf_hook") for layer in placed.model.model.layers)  # the hooks are in place
    assert not hasattr(tiny.model.model.layers[0], "_hf_hook")
    docs = dist_worker.documents()[:2]
    for lm, name in ((tiny, "plain"), (placed, "placed")):
        run_nearfar(
            lm,
            docs,
            NearfarSettings(dist_worker.P, [0, 32], 16, seeds=1, signals=dist_worker.CFG),
            tmp_path / name / "nf",
        )
        run_correlate(
            lm,
            docs[:1],
            CorrelateSettings(
                [Chunk(96, 112)], dist_worker.P, candidates="sample:8", resamples=0, signals=dist_worker.CFG
            ),
            tmp_path / name / "corr",
        )
    for table, column in (("nf/nearfar.csv", "fi"), ("corr/tokens.csv", "fi")):
        a, b = read_table(tmp_path / "plain" / table), read_table(tmp_path / "placed" / table)
        assert len(a) == len(b) > 0
        assert (a[column] - b[column]).abs().max() <= 1e-6, table
        assert a.drop(columns=[column]).equals(b.drop(columns=[column])) or table.startswith("corr")


# ---- the command line with SmolLM2 -------------------------------------------------------------------------------

DOCS = ["alice", "botchan", "hamlet"]
COMMANDS = {  # command line -> what rank 0 prints once, and options of the torchrun run only (units below the document)
    "nearfar": (
        [
            "nearfar",
            *DOCS,
            "--prefix",
            "128",
            "--distances",
            "0,64",
            "--chunk-len",
            "32",
            "--seeds",
            "1",
            "--protected-only",
        ],
        "entropy > attention across documents",
        ["--unit-sets", "2"],
    ),
    "correlate": (
        ["correlate", *DOCS, "--chunk", "128:160", "--candidates", "sample:8", "--resamples", "50"],
        "Spearman",
        ["--unit-candidates", "3"],
    ),
    "probe": (
        ["probe", *DOCS, "--chunk", "128:160", "--select", "entropy:remove=0.1", "--select", "random:remove=0.1@0"],
        "Forward Influence (nats)",
        [],
    ),
}


@pytest.mark.torchrun
@pytest.mark.smollm
@pytest.mark.parametrize("command", list(COMMANDS))
def test_torchrun_cli_equals_one_process(command, tmp_path):
    """``torchrun --nproc-per-node 2 -m fi_toolkit CMD ...`` writes the tables ``python -m fi_toolkit CMD`` does
    (nearfar and correlate split into parts under torchrun, whole documents in the single process)."""
    args, printed, split = COMMANDS[command]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [sys.executable, "-m", "fi_toolkit", *args, "--out", str(tmp_path / "one")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun(["-m", "fi_toolkit", *args, *split, "--out", str(tmp_path / "two")], timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    assert_same_tables(tmp_path / "one", tmp_path / "two")
    assert two.stdout.count(printed) == 1  # rank 0 reports, rank 1 is quiet
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    if split:
        assert {u["rank"] for u in manifest["units"]} == {0, 1} and len(manifest["units"]) > len(DOCS)


@pytest.mark.torchrun
@pytest.mark.smollm
def test_torchrun_scores_share_the_positions(tmp_path):
    """``fi scores --fi-chunk --estimator exact`` under torchrun: each rank measures a block of the
    positions, rank 0 writes the file the single process writes."""
    args = ["scores", "alice", "--prefix", "48", "--fi-chunk", "48:64", "--estimator", "exact"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [sys.executable, "-m", "fi_toolkit", *args, "--out", str(tmp_path / "one.csv")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun(["-m", "fi_toolkit", *args, "--out", str(tmp_path / "two.csv")], timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "two.csv").read_bytes()
    assert read_table(tmp_path / "two.csv")["fi_48:64"].notna().all()
    assert two.stderr.count("wrote 48 tokens") == 1  # rank 0 alone writes and reports


@pytest.mark.smollm
def test_cli_device_map_gives_the_plain_fi(smollm, tmp_path, capsys):
    from cli_runner import run_cli

    layers = [f"model.layers.{i}" for i in range(smollm.config.num_hidden_layers)]
    device_map = {n: "cpu" for n in ["model.embed_tokens", *layers, "model.norm", "model.rotary_emb", "lm_head"]}
    (tmp_path / "map.json").write_text(json.dumps(device_map))
    probe = [
        "probe",
        "alice",
        "--chunk",
        "128:160",
        "--select",
        "entropy:remove=0.1",
        "--select",
        "random:remove=0.1@0",
    ]
    for name, extra in (("plain", []), ("mapped", ["--device-map", str(tmp_path / "map.json")])):
        code, _, err = run_cli([*probe, *extra, "--out", str(tmp_path / name)], capsys)
        assert code == 0, err
    a, b = read_table(tmp_path / "plain" / "fi.csv"), read_table(tmp_path / "mapped" / "fi.csv")
    assert len(a) == len(b) > 0 and (a["fi"] - b["fi"]).abs().max() <= 1e-6
    assert json.loads((tmp_path / "mapped" / "manifest.json").read_text())["model"]["device"] == "cpu"
