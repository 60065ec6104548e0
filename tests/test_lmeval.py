"""The lm-evaluation-harness backend (fi_toolkit/evaluation/lmeval/, fi lm-eval).

Without lm-eval (the fast suite): a request's compressed scoring and generation against independent
computations (plain transformers forwards and ``model.generate``; the toolkit's replay and generate for
compressed caches), and the model arguments' checks. Marked ``lmeval`` (skipped where lm_eval is not
importable; ``make test-lmeval`` runs them in .venv-lmeval): the backend inside lm-eval on SmolLM2
against lm-eval's own ``hf`` backend, the full-budget oracle, a compressed run's results and samples
files, ``fi tasks export``'s tasks.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from fi_toolkit.compress.decoder import generate
from fi_toolkit.compress.replay import replay
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.arguments import parse_backend_args, split_model_args
from fi_toolkit.evaluation.lmeval.requests import generate_tokens, score_continuation
from fi_toolkit.policies import Adaptive, make_policy

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "lmeval"
HAS_LMEVAL = importlib.util.find_spec("lm_eval") is not None
lmeval = pytest.mark.skipif(not HAS_LMEVAL, reason="needs the lmeval extra (make test-lmeval)")


def _ids(n: int, seed: int, vocab: int = 256) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _plain_logprob(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """Oracle: one plain transformers forward of the whole sequence (no toolkit code)."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()
    logp = torch.log_softmax(logits, -1)
    target = torch.tensor(continuation)
    return float(logp.gather(1, target[:, None]).double().sum()), bool((logits.argmax(-1) == target).all())


# --- one request, without lm-eval (tiny random model) ------------------------------------------------


@pytest.mark.parametrize("interval", [1, 7, 1024])
def test_full_cache_scoring_equals_a_plain_forward(tiny, interval):
    context, continuation = _ids(90, 1), _ids(25, 2)
    logprob, greedy, record = score_continuation(tiny.model, context, continuation, None, interval)
    want, want_greedy = _plain_logprob(tiny.model, context, continuation)
    assert logprob == pytest.approx(want, abs=1e-4)
    assert greedy == want_greedy
    assert record.compressions == 0 and record.cache_entries == record.full_entries == 90 + 24


@pytest.mark.parametrize("name", ["infokv", "snapkv", "h2o", "rpc"])
def test_compressed_scoring_equals_the_replay(tiny, name):
    """Teacher-forced on the compressed cache: the sum of replay's compressed NLLs, same compression points."""
    context, continuation = _ids(120, 3), _ids(40, 4)
    policy = make_policy(name, budget="keep=0.4", window=8)
    logprob, _, record = score_continuation(tiny.model, context, continuation, policy, 16)
    rep = replay(tiny.model, torch.tensor(context + continuation), len(context), policy, 16)
    assert logprob == pytest.approx(-float(rep.nll_compressed.double().sum()), abs=1e-4)
    assert record.compression_steps == [s for s in rep.compression_steps if s < len(continuation) - 1]
    assert record.compressions >= 1 and record.cache_entries < record.full_entries
    full, _, _ = score_continuation(tiny.model, context, continuation, None, 16)
    assert logprob != pytest.approx(full, abs=1e-3)  # the compression changed the scores


def test_full_budget_scores_as_no_policy(tiny):
    context, continuation = _ids(100, 5), _ids(30, 6)
    policy = make_policy("infokv", budget="keep=1.0", window=8)
    a = score_continuation(tiny.model, context, continuation, policy, 8)
    b = score_continuation(tiny.model, context, continuation, None, 8)
    assert a[0] == pytest.approx(b[0], abs=1e-5) and a[1] == b[1] and a[2].compressions == 0


def test_full_cache_generation_equals_model_generate(tiny):
    prompt = _ids(60, 7)
    tokens, record = generate_tokens(tiny.model, prompt, None, 1024, 20, set(), lambda t: False)
    with torch.no_grad():
        want = tiny.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            min_new_tokens=20,
        )[0, 60:].tolist()
    assert tokens == want and record.new_tokens == 20 and record.compressions == 0


def test_compressed_generation_equals_generate(tiny):
    """The toolkit's compressed generate (EOS off) decodes the same tokens at the same compression points."""
    prompt = _ids(80, 8)
    policy = make_policy("infokv", budget="keep=40", window=8)
    tokens, record = generate_tokens(tiny.model, prompt, policy, 10, 35, set(), lambda t: False)
    ref = generate(tiny.model, None, torch.tensor(prompt), policy, max_new_tokens=35, interval=10, eos_token_id=[])
    assert tokens == ref.tokens
    assert record.compression_steps == [0] * ref.stats.prefill_compressed + ref.stats.compression_steps


def test_generation_stops_at_eos_and_stop_callback(tiny):
    prompt = _ids(30, 9)
    free, _ = generate_tokens(tiny.model, prompt, None, 1024, 12, set(), lambda t: False)
    stopped, _ = generate_tokens(tiny.model, prompt, None, 1024, 12, set(), lambda t: len(t) == 5)
    assert stopped == free[:5]
    at_eos, _ = generate_tokens(tiny.model, prompt, None, 1024, 12, {free[3]}, lambda t: False)
    assert at_eos == free[: free.index(free[3])]


def test_sampled_generation_is_seeded(tiny):
    prompt = _ids(30, 10)
    a, _ = generate_tokens(tiny.model, prompt, None, 1024, 15, set(), lambda t: False, True, 1.0, 0.9, seed=3)
    b, _ = generate_tokens(tiny.model, prompt, None, 1024, 15, set(), lambda t: False, True, 1.0, 0.9, seed=3)
    greedy, _ = generate_tokens(tiny.model, prompt, None, 1024, 15, set(), lambda t: False)
    assert a == b and a != greedy


# --- batches (tiny random model) ----------------------------------------------------------------------

BATCH_POLICIES = [None, "snapkv", "infokv", "pyramidkv", "infokv-adaptive"]  # the last two: uneven layers


def _batch_policy(name):
    return None if name is None else make_policy(name, budget="keep=0.25", window=8)


def _mc_pairs() -> list[tuple[list[int], list[int]]]:
    """Three contexts, each followed by four continuations (1 to 30 tokens: with interval 8, the two longest
    reach a compression point after the context), and one context of its own."""
    pairs = [
        (_ids(n, 20 + k), _ids(length, 40 + 4 * k + j))
        for k, n in enumerate((100, 77, 130))
        for j, length in enumerate((1, 5, 12, 30))
    ]
    return pairs + [(_ids(90, 60), _ids(6, 61))]


@pytest.mark.parametrize("name", BATCH_POLICIES)
def test_batched_scoring_equals_one_request_at_a_time(tiny, name, monkeypatch):
    """Batch 1 and batch 4 give the same log-likelihoods (1e-5), is-greedy flags and records; each equals an
    independent computation (a plain forward of the whole sequence; under a policy, the replay's compressed
    NLLs at the same points), and a shared context is prefilled and compressed once for its continuations."""
    from fi_toolkit.compress.batched import BatchedDecoder
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.evaluation.lmeval.batching import score_pairs

    pairs, policy = _mc_pairs(), _batch_policy(name)
    prefills, batches = [], []
    original, batched = CompressedDecoder.prefill, BatchedDecoder.prefill
    monkeypatch.setattr(
        CompressedDecoder, "prefill", lambda self, ids: prefills.append(ids.numel()) or original(self, ids)
    )

    def batched_prefill(self, prompts):
        prefills.extend(len(p) for p in prompts)
        batches.append(len(prompts))
        return batched(self, prompts)

    monkeypatch.setattr(BatchedDecoder, "prefill", batched_prefill)
    one, four = score_pairs(tiny.model, pairs, policy, 8, 1), score_pairs(tiny.model, pairs, policy, 8, 4)
    monkeypatch.undo()  # (the replay below prefills too)
    assert max(abs(a[0] - b[0]) for a, b in zip(one, four)) < 1e-5
    assert [a[1] for a in one] == [b[1] for b in four] and [a[2] for a in one] == [b[2] for b in four]
    for (context, continuation), (logprob, greedy, record) in zip(pairs, one):
        if policy is None:
            want, want_greedy = _plain_logprob(tiny.model, context, continuation)
            assert (logprob, greedy) == (pytest.approx(want, abs=1e-4), want_greedy)
            assert record.cache_entries == record.full_entries == len(context) + len(continuation) - 1
        else:
            rep = replay(tiny.model, torch.tensor(context + continuation), len(context), policy, 8)
            assert logprob == pytest.approx(-float(rep.nll_compressed.double().sum()), abs=1e-4)
            assert record.compressions >= 1 and record.cache_entries < record.full_entries
            if len(continuation) > 1:  # (a replay of one token compresses nothing: nothing reads the cache)
                assert record.compression_steps == [s for s in rep.compression_steps if s < len(continuation) - 1]
    if policy is None:
        assert prefills == []  # padded rows, no decoder
    else:  # per batch size: 4 contexts once each, and the 6 continuations that reach a compression on their own
        assert sorted(prefills) == sorted(2 * ([100, 77, 130, 90] + [100, 100, 77, 77, 130, 130]))
        # on their own caches, batched: those 6 and the only continuation of its context (90): 7 of 1, then 4 + 3
        assert batches == [1] * 7 + [4, 3]


def test_auto_batch_size_halves_on_out_of_memory(tiny, monkeypatch):
    """batch_size=auto starts at max_batch_size and halves it on a CUDA out-of-memory error, retrying the
    batch; the scores are those of batch size 1."""
    from fi_toolkit.evaluation.lmeval import batching

    pairs, sizes = _mc_pairs(), []
    original = batching._right_padded

    def padded(rows, device):
        sizes.append(len(rows))
        if len(rows) > 3:
            raise torch.cuda.OutOfMemoryError("out of memory")
        return original(rows, device)

    monkeypatch.setattr(batching, "_right_padded", padded)
    auto = batching.score_pairs(tiny.model, pairs, None, 8, "auto", max_batch_size=16)
    assert sizes == [13, 8, 4] + [2] * 6 + [1]  # 16 (all 13 rows), 8, 4 fail; 2 is kept for the rest
    one = batching.score_pairs(tiny.model, pairs, None, 8, 1)
    assert max(abs(a[0] - b[0]) for a, b in zip(auto, one)) < 1e-5
    with pytest.raises(torch.cuda.OutOfMemoryError):  # a fixed size is the user's: not changed
        batching.score_pairs(tiny.model, pairs, None, 8, 4)


def test_batched_generation_equals_one_request_at_a_time(tiny):
    """policy=none, prompts of different lengths padded on the left: batch 1 and batch 4 generate exactly the
    tokens plain ``model.generate`` gives each prompt alone, with per-row stops (EOS, a stop rule, max_new)
    and seeded sampling as one request at a time gives them."""
    from fi_toolkit.compress.sampling import GREEDY, Sampling
    from fi_toolkit.evaluation.lmeval.batching import Generation, generate_full_cache

    prompts = [_ids(n, 70 + n) for n in (40, 61, 23, 50, 50, 9)]
    free = [Generation(q, 10 + 2 * i, lambda t: False, GREEDY) for i, q in enumerate(prompts)]
    one, four = (generate_full_cache(tiny.model, free, set(), size) for size in (1, 4))
    assert one == four
    # a prefill in chunks of 16 positions: the short rows' first chunks are all padding
    assert generate_full_cache(tiny.model, free, set(), 4, prefill_chunk=16) == one
    for spec, (tokens, record) in zip(free, one):
        with torch.no_grad():
            want = tiny.model.generate(
                torch.tensor([spec.prompt]),
                max_new_tokens=spec.max_new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                min_new_tokens=spec.max_new,
            )[0, len(spec.prompt) :].tolist()
        assert tokens == want
        assert record.cache_entries == record.full_entries == len(spec.prompt) + spec.max_new - 1
    eos = {one[5][0][1]}  # the second token of the last row: an EOS within its stop rule
    stopped = [Generation(q, 20, lambda t, n=i: len(t) == 3 + n, GREEDY) for i, q in enumerate(prompts)]
    sampled = [Generation(q, 12, lambda t: False, Sampling(1.0, 0.9, 7 + i)) for i, q in enumerate(prompts)]
    for specs, eos_ids, sample in ((stopped, eos, False), (sampled, set(), True)):
        batched = generate_full_cache(tiny.model, specs, eos_ids, 4)
        for spec, (tokens, record) in zip(specs, batched):
            s = spec.sampling
            alone = generate_tokens(
                tiny.model,
                spec.prompt,
                None,
                1024,
                spec.max_new,
                eos_ids,
                spec.stop,
                sample,
                s.temperature,
                s.top_p,
                s.seed,
            )
            assert (tokens, record) == alone
    assert [len(t) for t, _ in generate_full_cache(tiny.model, stopped, eos, 4)] != [3, 4, 5, 6, 7, 8]  # EOS cut some


COMPRESSED_BATCH_POLICIES = ["snapkv", "infokv", "pyramidkv", "infokv-adaptive"]  # the last two: uneven layers


@pytest.mark.parametrize("name", COMPRESSED_BATCH_POLICIES)
def test_batched_compressed_generation_equals_one_request_at_a_time(tiny, name):
    """Under a policy keeping 25 % with a compression every 4 tokens (shorter than the generation), prompts of
    different lengths decoded 4 together give exactly the tokens and records (cache entries, compressions and
    their steps) of one request at a time, with per-row stops (EOS, a stop rule, max_new) and seeded sampling;
    batch 1 and batch 4 agree."""
    from fi_toolkit.compress.sampling import GREEDY, Sampling
    from fi_toolkit.evaluation.lmeval.batching import Generation, generate_compressed

    policy = _batch_policy(name)
    prompts = [_ids(n, 70 + n) for n in (40, 61, 23, 50, 50, 9)]  # 9: too short to compress at the prefill
    free = [Generation(q, 12 + 2 * i, lambda t: False, GREEDY) for i, q in enumerate(prompts)]
    one, four = (generate_compressed(tiny.model, free, policy, 4, set(), size) for size in (1, 4))
    assert one == four
    assert generate_compressed(tiny.model, free, policy, 4, set(), 4, prefill_chunk=16) == one
    eos = {one[5][0][1]}  # the second token of the last row: an EOS within its stop rule
    stopped = [Generation(q, 20, lambda t, n=i: len(t) == 3 + n, GREEDY) for i, q in enumerate(prompts)]
    sampled = [Generation(q, 12, lambda t: False, Sampling(1.0, 0.9, 7 + i)) for i, q in enumerate(prompts)]
    for specs, eos_ids, sample in ((free, set(), False), (stopped, eos, False), (sampled, set(), True)):
        batched = generate_compressed(tiny.model, specs, policy, 4, eos_ids, 4)
        for spec, (tokens, record) in zip(specs, batched):
            s = spec.sampling
            alone = generate_tokens(
                tiny.model,
                spec.prompt,
                policy,
                4,
                spec.max_new,
                eos_ids,
                spec.stop,
                sample,
                s.temperature,
                s.top_p,
                s.seed,
            )
            assert (tokens, record) == alone
    records = [record for _, record in one]
    # the rows compress at different points: the prompt and every 4 tokens; only once decoding has made the
    # 23-token prompt long enough; never (the 9-token prompt: 25 % of 30 tokens is not above the window)
    for i in (0, 1, 3, 4):
        assert records[i].compression_steps == list(range(0, records[i].new_tokens, 4))
    assert records[2].compression_steps == [12] and records[5].compressions == 0


@pytest.mark.parametrize("name", ["snapkv", "infokv"])
def test_batched_rows_see_only_themselves(tiny, name):
    """Teacher-forced through a batch of 3 prompts (9, 61 and 30 tokens: the short rows are mostly pad slots),
    every row's logits at every step equal its own decoder's alone (1e-4), and after every compression its kept
    positions equal its own keep maps alone: a pad attended, or another row's signals or compression leaking
    into a row, would change them."""
    from fi_toolkit.compress.batched import BatchedDecoder
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.model.attention import ragged_attention

    policy = _batch_policy(name)
    prompts = [_ids(n, 200 + n) for n in (9, 61, 30)]
    fed = [_ids(14, 300 + r) for r in range(3)]
    alone = []
    with ragged_attention(tiny.model):
        for prompt, tokens in zip(prompts, fed):
            decoder = CompressedDecoder(tiny.model, policy, 80, interval=4, keep_maps=True)
            logits = [decoder.prefill(torch.tensor(prompt))[0]]
            logits += [decoder.step(t) for t in tokens]
            decoder.close()
            alone.append((torch.stack(logits), decoder))
        batch = BatchedDecoder(tiny.model, policy, [80] * 3, interval=4, keep_maps=True)
        logits = [batch.prefill(prompts)]
        logits += [batch.step([fed[r][s] for r in range(3)]) for s in range(14)]
        batch.close()
    assert batch.dead is not None  # the short rows' pads are dead slots
    for r, (want, decoder) in enumerate(alone):
        got = torch.stack([step[r] for step in logits])
        assert (got - want).abs().max() < 1e-4
        mine = batch.rows[r].compressions
        assert [c.step for c in mine] == [c.step for c in decoder.compressions] and len(mine) >= (0, 3, 1)[r]
        for a, b in zip(mine, decoder.compressions):
            assert all(torch.equal(p, q) for p, q in zip(a.positions, b.positions))
        assert batch.lengths(r) == decoder.lengths()


@pytest.mark.smollm
def test_smollm_batched_compressed_generation_equals_one_request_at_a_time(smollm, alice):
    """SmolLM2 under InfoKV keeping 25 % with a compression every 4 tokens: four passages of different lengths
    decoded together give the tokens and records of each decoded alone (float32)."""
    from fi_toolkit.compress.sampling import GREEDY
    from fi_toolkit.evaluation.lmeval.batching import Generation, generate_compressed

    policy = make_policy("infokv", budget="keep=0.25", window=8)
    ids = alice.ids.tolist()
    prompts = [ids[a : a + n] for a, n in ((0, 180), (300, 97), (700, 140), (1100, 60))]
    specs = [Generation(q, 16, lambda t: False, GREEDY) for q in prompts]
    batched = generate_compressed(smollm.model, specs, policy, 4, set(), 4)
    for spec, got in zip(specs, batched):
        assert got == generate_tokens(smollm.model, spec.prompt, policy, 4, 16, set(), spec.stop)
        assert got[1].compressions >= 4


# --- model arguments ---------------------------------------------------------------------------------


def test_model_args_as_lm_eval_passes_them():
    args = parse_backend_args(
        **split_model_args("pretrained=x,policy=infokv,budget=keep=2048,interval=1024,alpha=0.5"),
        batch_size=1,
        device="cpu",
    )
    policy = args.make_policy()
    assert (args.interval, policy.alpha, policy.budget.label, args.device) == (1024, 0.5, "keep=2048", "cpu")
    spelled = parse_backend_args(policy="infokv:alpha=0.5:tau=2", budget=0.25).make_policy()
    assert (spelled.alpha, spelled.tau, spelled.budget.label) == (0.5, 2, "keep=0.25")
    assert parse_backend_args(policy="none").make_policy() is None
    assert isinstance(parse_backend_args(policy="infokv-adaptive").make_policy(), Adaptive)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": "bogus"}, "unknown policy 'bogus'"),
        ({"policy": "infokv", "budget": "keep=32"}, "cannot hold the observation window of 32"),
        ({"policy": "infokv", "interval": 0}, "interval=0"),
        ({"policy": "infokv", "interval": 2.5}, "interval=2.5"),
        ({"policy": "infokv", "alpha": math.nan}, "alpha=nan: not a finite number"),
        ({"policy": "infokv", "tau": math.inf}, "tau=inf: not a finite number"),
        ({"policy": "infokv", "alpha": 2.0}, "alpha must lie in [0, 1]"),
        ({"policy": "snapkv", "alpha": 0.5}, "policy snapkv has no option alpha"),
        ({"policy": "infokv:alpha"}, "write options as NAME:key=value"),
        ({"policy": "infokv", "budget": "keep=lots"}, "is not a number"),
        ({"policy": "none", "alpha": 0.5}, "unknown model argument alpha"),
        ({"dtype": "float8"}, "unknown dtype 'float8'"),
        ({"upcast": "maybe"}, "upcast='maybe'"),
    ],
)
def test_bad_model_args_fail_in_one_line(kwargs, message):
    with pytest.raises(FIError) as exc:
        parse_backend_args(**kwargs)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("value", [0, -1, "0", "-3", "abc", "2.5", "auto:0", "auto:x", True])
def test_bad_batch_size_fails_in_one_line(value):
    with pytest.raises(FIError) as exc:
        parse_backend_args(batch_size=value)
    assert f"batch_size={value!r}: need an integer >= 1, auto or auto:N" == str(exc.value)


@pytest.mark.parametrize(
    "value, want", [(1, 1), ("8", 8), (4.0, 4), ("auto", "auto"), ("auto:4", "auto"), ("AUTO", "auto")]
)
def test_batch_sizes_as_lm_eval_passes_them(value, want):
    assert parse_backend_args(batch_size=value, max_batch_size="16").batch_size == want


@pytest.mark.parametrize("device", ["tpu", "foo", "0", "cuda:-1", "meta"])
def test_unknown_device_fails_in_one_line(device):
    with pytest.raises(FIError) as exc:
        parse_backend_args(device=device)
    assert f"device '{device}'" in str(exc.value) and "\n" not in str(exc.value)


def test_cuda_index_beyond_the_machines_devices_fails(monkeypatch):
    """On a machine with one CUDA device, cuda:7 does not exist; cuda:0 does. Without CUDA, a CUDA device
    passes the check (the backend runs it on the CPU, as lm-eval's hf backend does)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(FIError, match=r"device 'cuda:7' does not exist: this machine has 1 CUDA device\(s\)"):
        parse_backend_args(device="cuda:7")
    assert parse_backend_args(device="cuda:0").device == "cuda:0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_backend_args(device="cuda:7").device == "cuda:7"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch_size", "0"], "batch_size='0': need an integer >= 1"),
        (["-b", "-2"], "batch_size='-2': need an integer >= 1"),
        (["--batch_size=many"], "batch_size='many': need an integer >= 1"),
        (["--model_args", "batch_size=-1"], "batch_size=-1: need an integer >= 1"),
        (["--device", "tpu"], "device 'tpu' does not exist"),
        (["--model_args", "device=foo"], "device 'foo' does not exist"),
        (["--max_batch_size", "0"], "max_batch_size='0'"),
    ],
)
def test_cli_bad_batch_size_or_device_is_one_line_and_exit_2(argv, message, capsys):
    """Checked before lm-eval is imported or any model loads: one error line, exit status 2, no traceback."""
    from cli_runner import run_cli

    code, _, err = run_cli(["lm-eval", "--model", "fi", "--tasks", "fi_mc", *argv], capsys)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


@lmeval
@pytest.mark.lmeval
def test_cli_unknown_model_is_one_line_and_exit_2(capsys):
    from cli_runner import run_cli

    code, _, err = run_cli(["lm-eval", "--model", "bogus", "--tasks", "fi_mc"], capsys)
    assert code == 2 and "unknown --model 'bogus' (known: " in err and " hf, " in err and err.count("\n") == 1


# --- inside lm-eval (SmolLM2; .venv-lmeval) ----------------------------------------------------------


def _evaluate(model, tasks, limit=None, include=DATA, **kwargs):
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model,
        tasks=tasks,
        limit=limit,
        log_samples=True,
        task_manager=TaskManager(include_path=str(include)),
        **kwargs,
    )


@pytest.fixture(scope="module")
def fi_none(smollm):
    from fi_toolkit.evaluation.lmeval.backend import CompressedLM

    return CompressedLM(lm=smollm, policy="none")


@pytest.fixture(scope="module")
def hf_lm(smollm):
    """lm-eval's own hf backend on the same weights and tokenizer."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=smollm.model, tokenizer=smollm.tokenizer, batch_size=1)


@pytest.fixture(scope="module")
def exported(smollm, tmp_path_factory):
    from fi_toolkit.evaluation.lmeval.export import export_tasks

    out = tmp_path_factory.mktemp("fi_tasks")
    export_tasks(out, smollm.tokenizer, ["passkey"], 300, 3, max_gen_toks=12, config=smollm.config)
    return out


def _lls(results, task):
    return [r["resps"][i][0][0] for r in results["samples"][task] for i in range(len(r["resps"]))]


@lmeval
@pytest.mark.lmeval
@pytest.mark.smollm
def test_loglikelihoods_equal_the_hf_backend(fi_none, hf_lm, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task's data path is relative to the repository root
    ours, theirs = _evaluate(fi_none, ["fi_mc"]), _evaluate(hf_lm, ["fi_mc"])
    a, b = _lls(ours, "fi_mc"), _lls(theirs, "fi_mc")
    assert len(a) == 16 and max(abs(float(x) - float(y)) for x, y in zip(a, b)) < 1e-4
    assert ours["results"]["fi_mc"]["acc,none"] == theirs["results"]["fi_mc"]["acc,none"]


@lmeval
@pytest.mark.lmeval
@pytest.mark.smollm
def test_rolling_loglikelihood_equals_a_plain_forward(fi_none, smollm, monkeypatch):
    monkeypatch.chdir(ROOT)
    results = _evaluate(fi_none, ["fi_rolling"])
    tok = smollm.tokenizer
    for row in results["samples"]["fi_rolling"]:
        ids = tok.encode(row["doc"]["text"], add_special_tokens=False)
        want, _ = _plain_logprob(smollm.model, [fi_none.prefix_token_id], ids)
        assert float(row["resps"][0][0]) == pytest.approx(want, abs=1e-3)


@lmeval
@pytest.mark.lmeval
@pytest.mark.smollm
def test_generations_equal_the_hf_backend_token_for_token(fi_none, hf_lm, smollm, exported):
    ours, theirs = (_evaluate(lm, ["fi_passkey"], include=exported) for lm in (fi_none, hf_lm))
    a = [r["resps"][0][0] for r in ours["samples"]["fi_passkey"]]
    b = [r["resps"][0][0] for r in theirs["samples"]["fi_passkey"]]
    assert a == b and all(a)
    # token for token against plain greedy model.generate, before the stop string cut
    doc = ours["samples"]["fi_passkey"][0]
    prompt = smollm.tokenizer.encode(doc["arguments"][0][0])
    with torch.no_grad():
        want = smollm.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :]
    assert smollm.tokenizer.decode(want).split("\n\n")[0] == a[0]


@lmeval
@pytest.mark.lmeval
@pytest.mark.smollm
def test_full_budget_equals_none_inside_lm_eval(smollm, fi_none, monkeypatch):
    from fi_toolkit.evaluation.lmeval.backend import CompressedLM

    monkeypatch.chdir(ROOT)
    full = CompressedLM(lm=smollm, policy="infokv", budget="keep=1.0", interval=4)
    a, b = _evaluate(full, ["fi_mc"], limit=2), _evaluate(fi_none, ["fi_mc"], limit=2)
    # float32 log-likelihood sums of about -10: 1e-5 relative is some tens of ulps (the two paths' reductions round
    # differently on some CPUs: 1.2e-6 relative seen); a wrong mask or position moves them by 1e-2 and more
    assert _lls(a, "fi_mc") == pytest.approx(_lls(b, "fi_mc"), rel=1e-5, abs=1e-5)
    assert all(rec["compressions"] == 0 for recs in full.records.values() for rec in recs)


@lmeval
@pytest.mark.lmeval
@pytest.mark.smollm
def test_compressed_cli_run_writes_results_with_policy_and_records(exported, tmp_path, monkeypatch, capsys):
    """fi lm-eval end to end: lm-eval's results file names the policy, the samples log each request's
    realised cache (fewer entries than a full cache) and its compressions."""
    from cli_runner import run_cli

    monkeypatch.chdir(ROOT)
    tasks = tmp_path / "tasks"  # lm-eval takes one --include_path: the exported tasks and fi_mc together
    shutil.copytree(exported, tasks)
    shutil.copy(DATA / "fi_mc.yaml", tasks)
    code, _, err = run_cli(
        [
            "lm-eval",
            "--model",
            "fi",
            "--model_args",
            "pretrained=smollm2-135m,policy=infokv,budget=keep=96,interval=4",  # lm-eval's default device
            "--tasks",
            "fi_mc,fi_passkey",
            "--include_path",
            str(tasks),
            "--limit",
            "2",
            "--output_path",
            str(tmp_path / "out"),
            "--log_samples",
        ],
        capsys,
    )
    assert code == 0, err[-2000:]
    fallback = "device 'cuda:0' requested but CUDA is not available; running on the CPU"
    assert (fallback in err) == (not torch.cuda.is_available())  # lm-eval's default, cuda:0, as its hf backend
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert results["config"]["model_args"]["policy"] == "infokv" and results["config"]["fi_policy"] == "infokv@keep=96"
    for task in ("fi_mc", "fi_passkey"):
        rows = [json.loads(l) for f in (tmp_path / "out").rglob(f"samples_{task}_*.jsonl") for l in f.open()]
        assert len(rows) == 2
        records = [rec for row in rows for rec in row["fi_toolkit"]]
        assert all(rec["cache_entries"] < rec["full_entries"] and rec["compressions"] >= 1 for rec in records)
        assert all(rec["cache_entries"] <= 96 + 4 for rec in records)


class CharTokenizer:
    """A tokenizer for the tiny model: one id per character (3 + its code point, below the vocabulary of 256),
    EOS 2; decodes what it encodes."""

    eos_token_id, bos_token_id, bos_token, eos_token, name_or_path = 2, None, None, None, "chars"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [3 + ord(c) % 253 for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i - 3) for i in ids if i >= 3)


def _text(n: int, seed: int) -> str:
    return "".join(chr(97 + i % 26) for i in _ids(n, seed, 250))


@lmeval
@pytest.mark.lmeval
@pytest.mark.parametrize("policy", ["none", "snapkv", "infokv"])
def test_backend_batch_1_and_4_give_the_same_numbers(tiny, policy):
    """Through the backend (tiny model, a character tokenizer): multiple-choice log-likelihoods (4 choices
    per context), rolling windows and generations with stop strings, batch 1 against batch 4, at policy=none
    and under SnapKV and InfoKV keeping 25 % with a compression every 4 tokens (shorter than the generation)."""
    from types import SimpleNamespace

    from lm_eval.api.instance import Instance

    from fi_toolkit.evaluation.lmeval.backend import CompressedLM

    lm = SimpleNamespace(model=tiny.model, tokenizer=CharTokenizer(), device=tiny.device, describe=lambda: {})
    meta = ("t", 0, 1)
    mc = [
        Instance("loglikelihood", {}, (_text(n, 80 + k), " " + _text(1 + 3 * j, 90 + j)), j, (f"mc{k}", k, 1))
        for k, n in enumerate((120, 150, 97))
        for j in range(4)
    ]
    rolling = [Instance("loglikelihood_rolling", {}, (_text(n, 100 + n),), 0, meta) for n in (150, 70)]
    gen = [
        Instance("generate_until", {}, (_text(n, 110 + n), {"until": ["qq"], "max_gen_toks": 14}), 0, ("g", i, 1))
        for i, n in enumerate((130, 101, 160, 90, 125))
    ]
    runs = []
    for size in (1, 4):
        backend = CompressedLM(
            lm=lm, policy=policy, budget="keep=0.25", interval=4, window=4, max_length=64 + 16, batch_size=size
        )
        runs.append(
            (
                backend.loglikelihood(mc, disable_tqdm=True),
                backend.loglikelihood_rolling(rolling, disable_tqdm=True),
                backend.generate_until(gen, disable_tqdm=True),
                dict(backend.records),
            )
        )
    (mc1, roll1, gen1, rec1), (mc4, roll4, gen4, rec4) = runs
    assert max(abs(a[0] - b[0]) for a, b in zip(mc1, mc4)) < 1e-5 and [a[1] for a in mc1] == [b[1] for b in mc4]
    assert roll1 == pytest.approx(roll4, abs=1e-5) and gen1 == gen4 and all(gen1)
    assert rec1 == rec4
    compressed = [r["compressions"] for recs in rec1.values() for r in recs]
    assert len(compressed) == 12 + 3 + 5 and len(rec1[("t", 0)]) == 3  # rolling windows of 80 tokens: 2 + 1
    if policy == "none":
        assert set(compressed) == {0}
    else:  # every context, window and prompt was compressed, and generation compressed again every 4 tokens
        assert min(compressed) >= 1
        assert all(r["compressions"] >= 3 for i in range(5) for r in rec1[("g", i)])


@lmeval
@pytest.mark.lmeval
@pytest.mark.smollm
@pytest.mark.parametrize("policy", ["none", "snapkv", "infokv"])
def test_smollm_batch_1_and_4_give_the_same_numbers(smollm, exported, policy, monkeypatch, tmp_path):
    """The real model inside lm-eval: fi_mc (multiple choice) and fi_passkey (generation) at batch 1 and batch
    4 give the same loglikelihoods (1e-5) and the same generations, at policy=none and under SnapKV and InfoKV
    keeping 25 % with a compression every 4 generated tokens."""
    from fi_toolkit.evaluation.lmeval.backend import CompressedLM

    monkeypatch.chdir(ROOT)
    tasks = tmp_path / "tasks"
    shutil.copytree(exported, tasks)
    shutil.copy(DATA / "fi_mc.yaml", tasks)
    runs = []
    for size in (1, 4):
        lm = CompressedLM(lm=smollm, policy=policy, budget="keep=0.25", interval=4, batch_size=size)
        runs.append((_evaluate(lm, ["fi_mc", "fi_passkey"], include=tasks), lm.records))
    (a, rec_a), (b, rec_b) = runs
    assert len(_lls(a, "fi_mc")) == 16
    ours, theirs = [float(x) for x in _lls(a, "fi_mc")], [float(y) for y in _lls(b, "fi_mc")]
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-5)  # padding reorders float32 sums (1.1e-5 seen at -10)
    gen_a = [r["resps"][0][0] for r in a["samples"]["fi_passkey"]]
    assert gen_a == [r["resps"][0][0] for r in b["samples"]["fi_passkey"]] and all(gen_a)
    assert dict(rec_a) == dict(rec_b)
    if policy != "none":
        assert all(r["compressions"] >= 1 for recs in rec_a.values() for r in recs)


@lmeval
@pytest.mark.lmeval
def test_lm_evals_own_backends_stay_available_beside_fi():
    """Registering fi must not hide lm-eval's own backends (its registry loads them only when it is empty), so
    fi lm-eval --model hf works; checked in a fresh interpreter, where nothing else has imported them."""
    import subprocess
    import sys

    code = (
        "import fi_toolkit.evaluation.lmeval.backend as b; from lm_eval.api.registry import get_model; "
        "print(get_model('fi') is b.CompressedLM, get_model('hf').__name__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "HFLM"], proc.stderr[-2000:]


@lmeval
@pytest.mark.lmeval
def test_records_belong_to_the_backend_and_reach_only_the_run_that_built_it():
    """A backend keeps its own records (no class-level list); one built inside samples_annotated() has them added
    to the samples lm-eval's tracker saves in that block, one built outside does not, and after the block the
    tracker is lm-eval's own again."""
    from types import SimpleNamespace

    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    from fi_toolkit.evaluation.lmeval.backend import CompressedLM, samples_annotated

    def record(entries: int):
        return SimpleNamespace(as_dict=lambda: {"cache_entries": entries})

    def request(doc_id: int):
        return SimpleNamespace(task_name="t", doc_id=doc_id, idx=0)

    fake = SimpleNamespace(model=None, tokenizer=object())  # the records need no model
    original = EvaluationTracker.save_results_samples
    outside = CompressedLM(lm=fake, policy="none")
    outside._log(request(1), record(7))
    with samples_annotated() as run:
        inside = CompressedLM(lm=fake, policy="none")
        inside._log(request(0), record(5))
        assert run == [inside.records] and run[0] is inside.records
        samples = [{"doc_id": 0}, {"doc_id": 1}]
        EvaluationTracker().save_results_samples("t", samples)  # no output path: annotates, writes nothing
    assert samples == [{"doc_id": 0, "fi_toolkit": [{"idx": 0, "cache_entries": 5}]}, {"doc_id": 1}]
    assert not hasattr(CompressedLM, "all_records") and EvaluationTracker.save_results_samples is original
    later = [{"doc_id": 0}]
    CompressedLM(lm=fake, policy="none")._log(request(0), record(9))
    EvaluationTracker().save_results_samples("t", later)
    assert later == [{"doc_id": 0}]


@lmeval
@pytest.mark.lmeval
def test_cli_help_adds_the_model_arguments(capsys):
    from cli_runner import run_cli

    code, out, _ = run_cli(["lm-eval", "--help"], capsys)
    assert code == 0 and "policy=NAME" in out and "--model_args" in out and "--tasks" in out
