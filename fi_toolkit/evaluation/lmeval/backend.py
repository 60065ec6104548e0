"""``CompressedLM``: the toolkit as an lm-evaluation-harness model backend (``--model fi``).

Every request runs on a cache kept to a policy's budget in the paper's regime (InfoKV: compression
at prefill and every ``interval`` generated tokens; :mod:`.requests`): ``generate_until`` decodes
with the compressed decoder, ``loglikelihood`` scores the continuation teacher-forced on the compressed
cache of the context, ``loglikelihood_rolling`` does so over lm-eval's rolling windows. ``batch_size``
requests run per forward (:mod:`.batching`), with the numbers one request at a time gives.

Per-request cache records (:class:`~.requests.CacheRecord`) belong to the backend: its ``records``, under
``(task, doc_id)``; :func:`annotate_samples` puts them into lm-eval's per-sample log (key ``fi_toolkit``).
lm-eval 0.4.x has no per-response extra-info field, and changing an ``Instance``'s arguments would break its
request cache (it hashes them again after the run), hence this side channel. A caller that built the backend
annotates ``simple_evaluate``'s samples with its ``records``; where lm-eval builds the backend itself from its
registry (``fi lm-eval``: its command line, which drops the model before it writes the samples), the run
opens :func:`samples_annotated`: each backend built inside the block hands its ``records`` to that run, and
the run adds them to each task's samples as lm-eval's tracker saves them. Nothing outlives the block.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import lm_eval.models  # noqa: F401  lm-eval's own backends (hf, vllm, ...): its registry loads them only when empty
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from fi_toolkit.compress.sampling import GREEDY, Sampling
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.arguments import BackendArgs, parse_backend_args
from fi_toolkit.evaluation.lmeval.batching import Generation, generate_compressed, generate_full_cache, score_pairs
from fi_toolkit.evaluation.lmeval.requests import stop_checker
from fi_toolkit.model.architectures import context_limit

NAME = "fi"
MAX_GEN_ALIASES = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
# the records of the backends built inside the current samples_annotated() block (None: outside any)
_RUN: ContextVar[list[dict] | None] = ContextVar("fi_lmeval_run", default=None)


def available_device(device: str) -> str:
    """The device to load on, as lm-eval's ``hf`` backend chooses it: ``auto`` is CUDA when there is one, else the
    CPU; a CUDA device (lm-eval's default is ``cuda:0``) on a machine without CUDA falls back to the CPU with one
    line on stderr; anything else is used as given (``load_model`` refuses a device that does not exist)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"fi lm-eval: device '{device}' requested but CUDA is not available; running on the CPU", file=sys.stderr)
        return "cpu"
    return device


@register_model(NAME)
class CompressedLM(TemplateLM):
    """``CompressedLM(pretrained=..., policy="infokv", budget="keep=2048", interval=1024, ...)``; the
    arguments are :class:`~.arguments.BackendArgs` (checked before the model loads), or pass a loaded
    model as ``lm=`` (a :class:`~fi_toolkit.model.loading.LoadedModel`)."""

    def __init__(self, lm=None, **kwargs):
        super().__init__()
        self.args: BackendArgs = parse_backend_args(**kwargs)
        self.policy = self.args.make_policy()
        if lm is None:
            from fi_toolkit.model.loading import load_model

            lm = load_model(
                self.args.pretrained,
                device=available_device(self.args.device),
                dtype=self.args.dtype,
                upcast=self.args.upcast,
            )
        if lm.tokenizer is None:
            raise FIError("the fi lm-eval backend needs a model with a tokenizer")
        self.lm, self.model, self.tokenizer = lm, lm.model, lm.tokenizer
        self.records: dict[tuple, list[dict]] = defaultdict(list)
        run = _RUN.get()
        if run is not None:  # built inside samples_annotated(): the run writes these records into the samples
            run.append(self.records)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> CompressedLM:
        """``--model_args`` text plus lm-eval's own settings (``--device``, ``--batch_size``); a model argument
        wins over the same lm-eval setting (``device=cpu`` in the model arguments beats ``--device``)."""
        from fi_toolkit.evaluation.lmeval.arguments import split_model_args

        return cls.create_from_arg_obj(split_model_args(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> CompressedLM:
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    # --- what lm-eval reads -------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.args.max_length or context_limit(self.model.config) or 2048

    @property
    def device(self):
        return self.lm.device

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids; no special tokens are added to a string that already opens with the BOS token
        (a chat-templated prompt), as lm-eval's ``hf`` backend does."""
        if add_special_tokens is None:
            bos = self.tokenizer.bos_token
            add_special_tokens = not (bos and string.startswith(bos))
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The tokenizer's chat template, as text (``--apply_chat_template``)."""
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # --- records ------------------------------------------------------------------------------------
    def _log(self, request, record) -> None:
        entry = {"idx": getattr(request, "idx", None), **record.as_dict()}
        self.records[(getattr(request, "task_name", None), getattr(request, "doc_id", None))].append(entry)

    # --- scoring ------------------------------------------------------------------------------------
    def _score_pairs(self, pairs: list[tuple[list[int], list[int]]], desc: str, disable_tqdm: bool) -> list:
        """``(log P, is_greedy, record)`` per pair, ``batch_size`` rows per forward (:mod:`.batching`)."""
        with tqdm(total=len(pairs), desc=desc, disable=disable_tqdm or self.rank != 0) as bar:
            return score_pairs(
                self.model,
                pairs,
                self.policy,
                self.args.interval,
                self.args.batch_size,
                self.args.max_batch_size,
                self.args.prefill_chunk,
                progress=bar.update,
            )

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``requests``: ``((context, continuation), context ids, continuation ids)``; the context is cut on
        the left so that both fit in ``max_length`` (as lm-eval's ``hf`` backend does)."""
        pairs = []
        for item in requests:
            _, context, continuation = item[:3]
            pairs.append((list(context)[-max(1, self.max_length - len(continuation)) :], list(continuation)))
        out = []
        for item, (logprob, greedy, record) in zip(
            requests, self._score_pairs(pairs, "Running loglikelihood requests", disable_tqdm)
        ):
            out.append((logprob, greedy))
            if len(item) > 3:  # the Instance, passed along by loglikelihood() below
                self._log(item[3], record)
            if self.cache_hook is not None and item[0] is not None:
                self.cache_hook.add_partial("loglikelihood", item[0], (logprob, greedy))
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """TemplateLM's tokenisation (lm-eval's rules for an empty context and trailing spaces), with each
        request's Instance kept beside it for the cache records."""
        encoded = []
        for request in requests:
            context, continuation = request.args
            if context == "":
                cont = self.tok_encode(continuation, add_special_tokens=False)
                ctx, cont = ([self.prefix_token_id], cont) if self.prefix_token_id != cont[0] else (cont[:1], cont[1:])
            else:
                ctx, cont = self._encode_pair(context, continuation)
            encoded.append(((context, continuation), ctx, cont, request))
        return self._loglikelihood_tokens(encoded, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The document's log-likelihood over lm-eval's disjoint rolling windows of ``max_length``
        tokens (the first conditioned on the prefix token), each scored on its compressed cache."""
        windows = []  # (request index, context, continuation) of every window of every document
        for n, request in enumerate(requests):
            (string,) = request.args
            for window in get_rolling_token_windows(
                token_list=self.tok_encode(string, add_special_tokens=False),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                context, continuation = make_disjoint_window(window)
                windows.append((n, list(context), list(continuation)))
        scored = self._score_pairs(
            [(c, t) for _, c, t in windows], "Running loglikelihood_rolling requests", disable_tqdm
        )
        out = [0.0] * len(requests)
        for (n, _, _), (logprob, _, record) in zip(windows, scored):
            out[n] += logprob
            record.request = "loglikelihood_rolling"
            self._log(requests[n], record)
        if self.cache_hook is not None:
            for request, total in zip(requests, out):
                self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return out

    # --- generation ---------------------------------------------------------------------------------
    def _gen_options(self, gen_kwargs: dict) -> dict:
        """lm-eval's generation kwargs -> until, max_new, do_sample, temperature, top_p (one FIError line
        for values that cannot be used)."""
        kwargs = dict(gen_kwargs or {})
        max_new = next((kwargs.pop(k) for k in MAX_GEN_ALIASES if kwargs.get(k) is not None), self.args.max_gen_toks)
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        eos_text = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        if eos_text and eos_text not in until:
            until.append(eos_text)
        temperature = float(kwargs.get("temperature", 0.0) or 0.0)
        do_sample = bool(kwargs.get("do_sample", temperature > 0))
        top_p = float(kwargs.get("top_p", 1.0) if kwargs.get("top_p") is not None else 1.0)
        if do_sample and temperature == 0:
            temperature = 1.0  # transformers' default for sampling without a temperature
        if not (isinstance(max_new, int) and max_new >= 1):
            raise FIError(f"max_gen_toks must be an integer >= 1, got {max_new!r}")
        if not (math.isfinite(temperature) and temperature >= 0 and 0 < top_p <= 1):
            raise FIError(f"need a finite temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
        return {"until": until, "max_new": max_new, "do_sample": do_sample, "temperature": temperature, "top_p": top_p}

    def _eos_ids(self) -> set[int]:
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        ids = ids if isinstance(ids, (list, tuple)) else [ids]
        return {int(i) for i in [*ids, self.eot_token_id] if i is not None}

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request decoded on its compressed cache; the text is cut at the first stop string, and for
        a reasoning model (``think_end_token``) only what follows its last end-of-thinking marker is kept.
        ``batch_size`` prompts per forward: :func:`~.batching.generate_full_cache` at ``policy=none``, under a
        policy :func:`~.batching.generate_compressed` (each row its own signals, compressions and budget)."""
        eos = self._eos_ids()
        options, specs = [], []
        for i, request in enumerate(requests):
            context, gen_kwargs = request.args
            opts = self._gen_options(gen_kwargs)
            prompt = self.tok_encode(context)
            room = self.max_length - opts["max_new"]
            if room < 1:
                raise FIError(
                    f"max_gen_toks ({opts['max_new']}) leaves no room for the prompt in max_length ({self.max_length})"
                )
            sampling = Sampling(opts["temperature"], opts["top_p"], self.args.seed + i) if opts["do_sample"] else GREEDY
            options.append(opts)
            specs.append(
                Generation(prompt[-room:], opts["max_new"], stop_checker(self.tokenizer, opts["until"]), sampling)
            )
        with tqdm(
            total=len(requests), desc="Running generate_until requests", disable=disable_tqdm or self.rank != 0
        ) as bar:
            if self.policy is None:
                generated = generate_full_cache(
                    self.model,
                    specs,
                    eos,
                    self.args.batch_size,
                    self.args.max_batch_size,
                    self.args.prefill_chunk,
                    progress=bar.update,
                )
            else:
                generated = generate_compressed(
                    self.model,
                    specs,
                    self.policy,
                    self.args.interval,
                    eos,
                    self.args.batch_size,
                    self.args.max_batch_size,
                    self.args.prefill_chunk,
                    progress=bar.update,
                )
        out = []
        for request, opts, (tokens, record) in zip(requests, options, generated):
            text = self.tokenizer.decode(tokens, skip_special_tokens=False)
            text = postprocess(text, opts["until"], self.args.think_end_token)
            out.append(text)
            self._log(request, record)
            if self.cache_hook is not None:
                self.cache_hook.add_partial("generate_until", request.args, text)
        return out

    def get_model_info(self) -> dict:
        """What lm-eval records about the model in its results file, with the policy."""
        return {"fi_policy": self.args.policy_label, "fi_interval": self.args.interval, "fi_model": self.lm.describe()}


def postprocess(text: str, until: list[str], think_end_token: str | None) -> str:
    """lm-eval's rule: drop the reasoning up to the last ``think_end_token``, then cut at the first
    occurrence of any stop string."""
    if think_end_token:
        text = text.split(think_end_token)[-1].lstrip()
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


@contextmanager
def samples_annotated() -> Iterator[list[dict]]:
    """Within the block, the ``records`` of every :class:`CompressedLM` built (by lm-eval, from its registry)
    go into each task's samples as lm-eval's ``EvaluationTracker`` saves them (``fi lm-eval`` runs lm-eval's
    command line inside it). Yields the list of those backends' records; the tracker is restored after."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    run: list[dict] = []
    original = EvaluationTracker.save_results_samples

    def save_results_samples(tracker, task_name, samples):
        for records in run:
            annotate_samples({task_name: samples}, records)
        return original(tracker, task_name, samples)

    token = _RUN.set(run)
    EvaluationTracker.save_results_samples = save_results_samples
    try:
        yield run
    finally:
        EvaluationTracker.save_results_samples = original
        _RUN.reset(token)


def annotate_samples(samples: dict, records: dict) -> int:
    """Add each request's cache record to lm-eval's per-sample log in place: ``samples[task]`` is the
    list ``simple_evaluate(..., log_samples=True)["samples"][task]``; ``records``: a backend's
    :attr:`CompressedLM.records`. Returns the number of samples annotated."""
    done = 0
    for task, rows in samples.items():
        for row in rows:
            found = records.get((task, row.get("doc_id")))
            if found:
                row["fi_toolkit"] = found
                done += 1
    return done
