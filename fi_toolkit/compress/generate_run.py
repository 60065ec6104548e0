"""The ``fi generate`` run: :func:`run_generate` generates from a prompt with the KV cache compressed by the
settings' policy (:func:`fi_toolkit.compress.decoder.generate`: the prompt at its prefill, then every
``interval`` generated tokens).

From the command line: ``fi generate`` parses its options into a
:class:`~fi_toolkit.compress.generate_settings.GenerateSettings`, reads the prompt, loads the model, calls
:func:`run_generate` (streaming the text to stdout) and prints the statistics table.
"""

from __future__ import annotations

from typing import Callable

import torch

from fi_toolkit.compress import decoder
from fi_toolkit.compress.decoder import GenerationResult, signal_config_for
from fi_toolkit.compress.generate_settings import GenerateSettings
from fi_toolkit.runs.settings import check_type


def run_generate(
    lm, prompt: str | torch.Tensor, settings: GenerateSettings, emit: Callable[[str], None] | None = None
) -> GenerationResult:
    """Generate from ``prompt`` under ``settings`` -> the text, its token ids and the statistics.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        prompt: the prompt text (wrapped in the chat template where ``settings.chat`` and the model has one),
            or its token ids ``[n]`` as they are.
        settings: how to generate (:class:`~fi_toolkit.compress.generate_settings.GenerateSettings`).
        emit: called with each piece of text as it is generated (streaming); None: the text only at the end.

    Returns:
        A :class:`~fi_toolkit.compress.decoder.GenerationResult`: ``text``, ``tokens`` (the new ids, an EOS
        included where it stopped there), ``prompt_ids`` ``[n]``, ``stats`` (tokens, seconds, compressions,
        cache bytes full, kept and at peak, peak memory) and ``prefill_keep`` (where the prompt was compressed).
    """
    check_type("settings", settings, GenerateSettings)
    policy = settings.make_policy()
    s = settings.signals  # the policy's window, top-k and tau; the pooling and the entropy convention of the run
    config = signal_config_for(policy, pool_kernel=s.pool_kernel, entropy_of=s.entropy_of)
    return decoder.generate(  # through the module: a test may stand in for the decoder's generate
        lm.model,
        lm.tokenizer,
        prompt,
        policy,
        max_new_tokens=settings.max_new,
        interval=settings.interval,
        compress_prompt=settings.compress_prompt,
        temperature=settings.temperature,
        top_p=settings.top_p,
        seed=settings.seed,
        chat=None if settings.chat else False,
        on_text=emit,
        config=config,
    )
