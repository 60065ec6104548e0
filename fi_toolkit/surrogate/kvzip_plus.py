"""KVzip+ scores: the teacher of KVzap's surrogate (arXiv 2601.07891), the like-for-like anchor of the FI-trained one.

KVzip (arXiv 2505.23416) scores a context's cache entries by how much the model attends to them while it
*reconstructs* the context: the input is the chat turn ``user: <context> Repeat the previous context exactly.``
followed by ``assistant: <context>``, and an entry's score is the largest attention weight any repeated token
gives it. KVzip+ (KVzap's target) weighs each weight by what the attention passes on: for query head ``h``,
repeated token ``t`` and context position ``i``,

    s[h, t, i] = a[h, t, i] * ||W_o,h v_i|| / ||x_t||

(``x_t`` the attention's input at ``t``, ``W_o,h`` head ``h``'s slice of the output projection, ``v_i`` the value
of ``i`` in ``h``'s KV group); the score of (KV head, ``i``) is the maximum over the repeated tokens and the
group's query heads. The surrogate trainer regresses its log, as KVzap does (``fi fit-surrogate --target
kvzip_plus``); the hidden states it regresses from are those of the plain document's forward, as for the
FI-trained surrogate, so the two differ in their teacher alone.

Written from the papers' definitions; one forward of ``2 p + O(1)`` tokens with eager attention, reduced layer by
layer in a hook (a layer's weights are ``[Hq, T, T]``, never all layers' at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

INSTRUCTION = "\n\nRepeat the previous context exactly."  # KVzip's reconstruction request


@dataclass(frozen=True)
class RepeatPrompt:
    """The reconstruction input's token ids and where the context and its repetition lie in it."""

    ids: torch.Tensor  # [T]
    context: slice
    repeat: slice


def repeat_prompt(tokenizer, context: torch.Tensor) -> RepeatPrompt:
    """``context`` ids inside the chat turn that asks for its repetition, built from token ids (the context is
    never decoded and re-tokenised, so its ids are exactly the document's): the template is rendered around a
    placeholder and each piece between the two context copies tokenised alone."""
    import torch

    mark = "\x00CONTEXT\x00"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": mark + INSTRUCTION}, {"role": "assistant", "content": mark}], tokenize=False
    )
    before, middle, after = text.split(mark)
    pieces = [
        torch.tensor(tokenizer(p, add_special_tokens=False).input_ids, dtype=torch.long) for p in (before, middle)
    ]
    tail = torch.tensor(tokenizer(after, add_special_tokens=False).input_ids, dtype=torch.long)
    context = context.to(torch.long).cpu()
    ids = torch.cat([pieces[0], context, pieces[1], context, tail])
    start, n = len(pieces[0]), len(context)
    again = start + n + len(pieces[1])
    return RepeatPrompt(ids, slice(start, start + n), slice(again, again + n))


def kvzip_plus_scores(model, prompt: RepeatPrompt) -> torch.Tensor:
    """KVzip+ scores ``[L, Hkv, n]`` (float32, positive) of the ``n`` context positions of ``prompt``, from one
    forward of ``model`` with eager attention (restored afterwards)."""
    import torch

    from fi_toolkit.model.architectures import decoder_parts

    blocks = decoder_parts(model)[0]
    scores: list = [None] * len(blocks)

    def hook(i):
        def reduce(module, _args, kwargs, output):
            x = kwargs["hidden_states"][0].float()  # [T, D]
            weights = output[1][0].float()  # [Hq, T, T]
            n_q, dh = weights.shape[0], module.head_dim
            n_kv = n_q // module.num_key_value_groups
            v = module.v_proj(kwargs["hidden_states"])[0].float().view(-1, n_kv, dh)  # [T, Hkv, dh]
            wo = module.o_proj.weight.float().view(-1, n_q, dh)  # [D, Hq, dh]
            v_q = v[prompt.context].repeat_interleave(module.num_key_value_groups, dim=1)  # [n, Hq, dh]
            passed = torch.linalg.vector_norm(torch.einsum("dhe,nhe->hnd", wo, v_q), dim=-1)  # [Hq, n]
            rows = weights[:, prompt.repeat, prompt.context] / x[prompt.repeat].norm(dim=-1)[None, :, None]
            s = rows.amax(dim=1) * passed  # [Hq, n]: the norm of W_o v is constant over rows, so max first
            scores[i] = s.view(n_kv, module.num_key_value_groups, -1).amax(dim=1)
            return (output[0], None, *output[2:])  # the layer's weights are not kept

        return reduce

    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = [b.self_attn.register_forward_hook(hook(i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            model.model(input_ids=prompt.ids.to(device)[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous)
    return torch.stack(scores).cpu()
