"""The ``fi`` backend's model arguments (``--model_args pretrained=...,policy=infokv,budget=keep=2048``),
checked before any model loads: one :class:`~fi_toolkit.errors.FIError` line for a bad one.

lm-eval splits ``--model_args`` at commas and the first ``=`` of each pair, and turns numbers and
``true``/``false`` into Python values (``nan`` becomes a float NaN), so every value here may arrive
as a string, a number or a bool. Policy options are model arguments of their own (``alpha=0.5``) or
written into the policy's name (``policy=infokv:alpha=0.5:tau=2``); every name resolves in the policy
registry (:mod:`fi_toolkit.policies.registry`), a provider's too: ``kvpress:NAME`` is a kvpress press (its
options after a colon).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies import Policy
from fi_toolkit.policies.registry import lookup, resolve

NONE = ("none", "full")  # the full cache
# Accepted and not used: ``tokenizer``, which tasks such as RULER read from the model arguments to size their
# data with, and ``trust_remote_code``, which lm-eval passes to every backend.
IGNORED = ("tokenizer", "trust_remote_code")
AUTO = "auto"  # batch_size=auto (lm-eval's auto:N too): start at max_batch_size, halve on a CUDA out-of-memory
DEVICES = "auto, cpu, cuda, cuda:N or mps"


@dataclass
class BackendArgs:
    """Everything the backend is told. ``budget`` and ``window`` feed the policy; ``interval``: generated
    (or scored) tokens between two compressions back to the budget, as in ``fi generate``."""

    pretrained: str = "smollm2-135m"
    policy: str = "none"
    budget: str = "keep=0.25"
    interval: int = 1024
    window: int = 32
    dtype: str = "float32"
    device: str = "auto"
    batch_size: int | str = 1  # rows per forward, or AUTO
    max_batch_size: int = 64  # the first size batch_size=auto tries (lm-eval's --max_batch_size)
    upcast: bool = True
    max_length: int | None = None  # the context for rolling log-likelihood windows (default: the model's)
    max_gen_toks: int = 256  # when a task gives none
    seed: int = 1234  # sampled decoding: request i draws from seed + i
    prefill_chunk: int = 2048
    think_end_token: str | None = None  # reasoning models: the answer is what follows its last occurrence
    policy_options: dict = field(default_factory=dict)

    def make_policy(self) -> Policy | None:
        """The policy (None: the full cache); raises FIError on an unknown name or option."""
        if self.policy.strip().lower() in NONE:
            return None
        return policy_from_spec(self.policy, self.budget, self.window, self.policy_options)

    @property
    def policy_label(self) -> str:
        policy = self.make_policy()
        return "none" if policy is None else policy.label


def policy_from_spec(spec: str, budget, window: int, options: dict) -> Policy:
    """``infokv``, ``infokv:alpha=0.5:tau=2``, ``kvpress:SnapKVPress`` -> a policy with ``budget``."""
    entry = lookup(spec, f"policy={spec}")
    if entry.cls is None:  # a provider's family (kvpress:NAME): its options are spelled after a colon
        if options:
            raise FIError(
                f"policy={spec}: give a press's options after its name ({entry.name}:key=value), "
                f"not as model arguments ({', '.join(options)})"
            )
        return resolve(spec, budget=budget, window=window)
    # lm-eval splits --model_args on commas, so options inside the name are separated by ':' here
    # (infokv:alpha=0.5:tau=2); the registry reads them as NAME:alpha=0.5,tau=2
    name, *parts = spec.strip().split(":")
    for part in parts:
        key, sep, _ = part.partition("=")
        if not sep or not key.strip():
            raise FIError(f"policy={spec}: write options as NAME:key=value, got '{part}'")
    text = name + (":" + ",".join(p.strip() for p in parts) if parts else "")
    known = [o.name for o in entry.options]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise FIError(
            f"policy {name} has no option {', '.join(unknown)} "
            f"(its options: {', '.join(k for k in known if k != 'window')})"
        )
    for k, v in options.items():
        _finite(k, v)
    policy = resolve(text, budget, window, where=f"policy={spec}", **options)
    from fi_toolkit.compress.decoder import signal_config_for

    signal_config_for(policy)  # top_k, tau, alpha, window: validated now
    return policy


def _number(text: str):
    """lm-eval's conversion of an argument value (numbers and booleans), for options inside a name."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _finite(name: str, value) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise FIError(f"model argument {name}={value}: not a finite number")


def _integer(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise FIError(f"model argument {name}={value!r}: need an integer >= {low}")
    try:
        number = float(value)
    except ValueError:
        raise FIError(f"model argument {name}={value!r}: need an integer >= {low}") from None
    if not math.isfinite(number) or number != int(number) or number < low:
        raise FIError(f"model argument {name}={value!r}: need an integer >= {low}")
    return int(number)


def _boolean(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise FIError(f"model argument {name}={value!r}: need true or false")


def check_batch_size(value) -> int | str:
    """lm-eval's ``batch_size`` (``--batch_size`` text, or a number from ``--model_args``) -> an integer >= 1
    or :data:`AUTO` (``auto`` and lm-eval's ``auto:N``, which re-detects N times, are both read as ``auto``)."""
    text = str(value).strip().lower()
    if not isinstance(value, bool) and (text == AUTO or re.fullmatch(r"auto:[1-9][0-9]*", text)):
        return AUTO
    try:
        return _integer("batch_size", value, 1)
    except FIError:
        raise FIError(f"batch_size={value!r}: need an integer >= 1, auto or auto:N") from None


def check_device(text: str) -> str:
    """``text`` if it names a device this machine can load a model on (``auto`` included); FIError otherwise:
    a name torch does not know (``tpu``, ``foo``), a CUDA index beyond the machine's devices (``cuda:7`` on a
    one-GPU machine), MPS where there is none, a kind the backend does not run on (``meta``, ``xpu``). A CUDA
    device on a machine without CUDA passes: the backend runs it on the CPU, as lm-eval's ``hf`` backend does."""
    import torch

    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise FIError(f"device '{text}' does not exist (use {DEVICES})") from None
    if device.type == "cuda" and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise FIError(
                f"device '{text}' does not exist: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise FIError(f"device '{text}' is not available on this machine (use {DEVICES})")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise FIError(f"device '{text}' is not supported by the fi backend (use {DEVICES})")
    return text


def split_model_args(text: str) -> dict:
    """``--model_args`` text -> a dict, as lm-eval reads it: pairs at commas, key and value at the first
    ``=``, ``true``/``false`` and numbers converted (lm_eval.utils.simple_parse_args_string's rules)."""
    out = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FIError(
                f"model_args: write KEY=VALUE pairs separated by commas, got '{pair}'", parameter="model_args"
            )
        out[key.strip()] = _number(value.strip())
    return out


def parse_backend_args(**kwargs) -> BackendArgs:
    """Check and convert the model arguments (as lm-eval hands them over) -> :class:`BackendArgs`.

    Raises FIError for an unknown argument or policy, a non-finite number, ``interval`` < 1, a ``batch_size``
    that is not an integer >= 1 or ``auto``/``auto:N``, a device that does not exist, or a budget
    that cannot hold the observation window (a token count not above ``window``); a share is checked
    per request (a short request is left uncompressed, as :meth:`CompressedDecoder.compress` does)."""
    names = {f.name for f in fields(BackendArgs)} - {"policy_options"}
    args = BackendArgs()
    options = {}
    for key, value in kwargs.items():
        if value is None or key in IGNORED:
            continue
        _finite(key, value)
        if key in names:
            setattr(args, key, value)
        else:
            options[key] = value
    args.policy, args.pretrained, args.dtype = str(args.policy), str(args.pretrained), str(args.dtype)
    args.batch_size = check_batch_size(args.batch_size)
    args.max_batch_size = _integer("max_batch_size", args.max_batch_size, 1)
    args.interval = _integer("interval", args.interval, 1)
    args.window = _integer("window", args.window, 1)
    args.max_gen_toks = _integer("max_gen_toks", args.max_gen_toks, 1)
    args.seed = _integer("seed", args.seed, 0)
    args.prefill_chunk = _integer("prefill_chunk", args.prefill_chunk, 1)
    if args.max_length is not None:
        args.max_length = _integer("max_length", args.max_length, 2)
    args.upcast = _boolean("upcast", args.upcast)
    if args.think_end_token is not None:
        args.think_end_token = str(args.think_end_token)
    none = args.policy.strip().lower() in NONE
    if none and options:
        raise FIError(f"unknown model argument {', '.join(sorted(options))} (policy=none takes no policy options)")
    if not none:
        args.policy_options = options
        budget = Budget.parse(str(args.budget), "budget=")
        if not budget.is_share and budget.side == "keep" and budget.amount <= args.window:
            raise FIError(
                f"budget={budget.label} cannot hold the observation window of {args.window} tokens "
                "(keep more than the window)"
            )
        args.budget = budget.label
        args.make_policy()  # unknown names and options fail here, before the model loads
    from fi_toolkit.model.loading import resolve_dtype  # imports torch: the checks above answer without it

    resolve_dtype(args.dtype)
    args.device = check_device(str(args.device))  # torch too: after every check that needs none
    return args
