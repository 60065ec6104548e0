"""``fi lm-eval``: lm-evaluation-harness with the toolkit's backend registered (``--model fi``).

lm-eval 0.4.x finds model backends through its registry only (no entry points), so this command
imports :mod:`fi_toolkit.evaluation.lmeval.backend` (which registers ``fi``) and hands every argument,
unchanged, to lm-eval's own command line. ``--model_args`` for ``--model fi`` are checked first (one
error line, exit 2, before any model loads), and the backend's per-request cache records go into
lm-eval's ``samples_*.jsonl`` (key ``fi_toolkit``) when ``--log_samples`` is given.
"""

from __future__ import annotations

import sys

import typer

from fi_toolkit.cli.options import out
from fi_toolkit.errors import FIError

BACKEND_HELP = """fi lm-eval: lm-evaluation-harness with the fi_toolkit backend (--model fi). Every argument goes to
lm-eval.

--model fi --model_args KEY=VALUE,... (checked before the model loads):
  pretrained=NAME        smollm2-135m (embedded, default), a local model directory or a cached HF id
  policy=NAME            {policies};
                         options inside the name (infokv:alpha=0.5:tau=2) or as model args (alpha=0.5)
  budget=B               keep=X or remove=X, X a share (0.25) or a token count (2048); default keep=0.25
  interval=N             generated/scored tokens between compressions back to the budget (default 1024)
  window=N               observation window, never evicted (default 32)
  dtype=D                float32 (default), bfloat16, float16; upcast=false computes in that dtype too
  device=D               auto (default), cpu, cuda, cuda:N, mps (or lm-eval's --device)
  batch_size=N           rows per forward, auto or auto:N (or lm-eval's --batch_size; default 1)
  max_length=N           context for rolling log-likelihood windows and prompts (default: the model's)
  max_gen_toks=N         when a task sets none (default 256)
  seed=N                 sampled decoding: request i draws from seed + i (default 1234)
  think_end_token=TEXT   reasoning models: keep only what follows the last occurrence (e.g. </think>)
  prefill_chunk=N        tokens per prefill forward (default 2048)

Example: fi lm-eval --model fi --model_args pretrained=meta-llama/Llama-3.1-8B-Instruct,policy=infokv,\\
budget=keep=2048,interval=1024,dtype=bfloat16 --tasks ifeval,gsm8k --apply_chat_template --output_path runs/lmeval
Recipes: docs/guides/lm-eval.md. lm-eval's own options follow.
"""


def _policy_list() -> str:
    """The registry's names (no oracle: nothing is known of a task's future), wrapped under ``policy=NAME``."""
    import textwrap

    from fi_toolkit.policies.registry import policy_names

    names = ", ".join(["none (full cache, default)", *policy_names(oracles=False)])
    return textwrap.fill(names, 105, initial_indent=" " * 25, subsequent_indent=" " * 25)[25:]


def _model_args(argv: list[str]) -> tuple[str | None, str | None]:
    """The values of --model and --model_args in lm-eval's argv (``--x v`` or ``--x=v``)."""
    found: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for name in ("--model", "--model_args"):
            if arg == name and i + 1 < len(argv):
                found[name] = argv[i + 1]
            elif arg.startswith(name + "="):
                found[name] = arg[len(name) + 1 :]
    return found.get("--model"), found.get("--model_args")


def _option(argv: list[str], name: str) -> str | None:
    """The value of lm-eval's option ``name`` in ``argv`` (``--x v`` or ``--x=v``), or None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None


def check_model_args(argv: list[str]) -> None:
    """For ``--model fi``: the model arguments checked as the backend will (FIError on a bad one), before
    lm-eval is imported (so a bad argument is one line even where lm-eval is missing)."""
    from fi_toolkit.evaluation.lmeval.arguments import parse_backend_args

    model, model_args = _model_args(argv)
    if model != "fi":
        return
    # lm-eval's own settings reach the backend beside the model arguments (a model argument wins)
    settings = {k: _option(argv, f"--{k}") for k in ("device", "batch_size", "max_batch_size")}
    settings["batch_size"] = settings["batch_size"] or _option(argv, "-b")
    parse_backend_args(**{**{k: v for k, v in settings.items() if v is not None}, **_parsed(model_args or "")})


def _parsed(model_args: str) -> dict:
    """``--model_args`` as lm-eval reads it: KEY=VALUE pairs, or a JSON object."""
    from fi_toolkit.evaluation.lmeval.arguments import split_model_args

    if model_args.lstrip().startswith("{"):  # lm-eval also takes a JSON object
        import json

        try:
            parsed = json.loads(model_args)
        except ValueError as exc:
            raise FIError(f"--model_args: not a JSON object ({exc})") from None
        if not isinstance(parsed, dict):
            raise FIError("--model_args: not a JSON object")
        return parsed
    return split_model_args(model_args)


def check_model(model: str | None) -> None:
    """FIError for a ``--model`` lm-eval's registry does not hold, or whose package is missing (``vllm``);
    None is lm-eval's default (``hf``)."""
    if model is None:
        return
    from lm_eval.api.registry import get_model

    try:
        get_model(model)
    except ValueError as exc:
        names = str(exc).rpartition("Supported model names:")[2].strip()
        raise FIError(f"unknown --model '{model}' (known: {names})") from None
    except ImportError as exc:
        raise FIError(f"--model {model} needs a package that is not installed ({exc})") from None


def run_lm_eval(argv: list[str]) -> int:
    """lm-eval's command line on ``argv`` with ``fi`` registered; returns its exit status."""
    helping = not argv or any(a in ("-h", "--help") for a in argv)
    if not helping:
        check_model_args(argv)
        output = _option(argv, "--output_path")
        if output:  # lm-eval finds an unwritable place only after every request has run
            from pathlib import Path

            from fi_toolkit.runs.results import check_out_path

            path = Path(output)  # a directory, or a .json file lm-eval names its results after
            check_out_path(path, want_dir=path.suffix != ".json", option="--output_path")
    try:
        import lm_eval  # noqa: F401
        from lm_eval.__main__ import cli_evaluate
    except ImportError as exc:
        raise FIError(f"lm-eval is not installed ({exc}); pip install 'fi_toolkit[lmeval]'") from None
    from fi_toolkit.evaluation.lmeval.backend import samples_annotated  # (importing it registers --model fi)

    if not helping:
        check_model(_model_args(argv)[0])
    if helping:
        out.print(BACKEND_HELP.format(policies=_policy_list()), markup=False, highlight=False)
        argv = ["run", "--help"]
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        with samples_annotated():  # each backend lm-eval builds hands its cache records to this run's samples
            cli_evaluate()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def register(app: typer.Typer) -> None:
    from fi_toolkit.cli.tasks import register as register_tasks

    @app.command(
        "lm-eval",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        add_help_option=False,
    )
    def lm_eval_command(ctx: typer.Context):
        """lm-evaluation-harness with the fi backend (--model fi); all arguments go to lm-eval (fi lm-eval --help)."""
        code = run_lm_eval(list(ctx.args))
        if code:
            raise typer.Exit(code)

    register_tasks(app)
