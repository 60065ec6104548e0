"""Long-context tasks, RULER-style: generated here from a seed, no downloads, the haystack
cut from the bundled books.

- ``passkey``: one pass key (a 5-digit number) hidden in the text; asked for it.
- ``multikey_needle``: several "special magic numbers", each under its own key; asked for one key's.
- ``variable_tracking``: chains of assignments (``VAR ABCDE = 12345.`` then ``VAR FGHIJ = ABCDE.`` ...);
  asked for the value of the last variable of one chain; a distractor chain holds another value.

:func:`make_sample` fills the haystack up to ``context_tokens`` tokens of the whole prompt (the
instruction, the text with its needles, the question, and the answer prefix that opens the assistant's
turn, all in the tokenizer's chat template when it has one), measured with the tokenizer, and puts the
needles at sentence boundaries at seeded depths.

Two protocols (:func:`split_prompt`, :func:`encode_split`): ``question-aware`` gives the compression
the whole prompt, question included; ``question-agnostic`` compresses the context alone and appends the
question afterwards (kvpress's context/question split). Both feed the same token ids.

Scoring (:func:`score`), exact match on the generated text (what follows the answer prefix): its
first non-empty line, lowercased, with punctuation turned into spaces (a comma between digits is a
thousands separator and goes), must hold the answer as a whole-word sequence, so ``12345`` does not
match ``123456``; repeating the answer is fine, but a line that also names another number of the
answer's digit count (a hedge among candidates) is wrong.

Measured (SmolLM2-135M, full cache, greedy, question-aware, seeds 0-7, ``analyses/task_lengths.py``
-> ``analyses/results/eval/task_lengths.csv``): passkey 0.75 / 0.62 / 0.25 at 1,024 / 2,048 / 4,096
tokens; multi-key needle 0.75 / 0.50 / 0.75; variable tracking (2 chains of 4 hops) 0 at every
length: the model does not solve it. ``fi eval --task`` therefore defaults to 1,024 tokens.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import torch

from fi_toolkit.documents import BUNDLED, bundled_path
from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import context_limit, context_phrase

PROTOCOLS = ("question-aware", "question-agnostic")
INSTRUCTION = (
    "Some important information is hidden inside the following text. "
    "Read it carefully and remember it; you will be asked about it afterwards."
)
_WORDS = (
    "amber apple birch cobalt coral crimson delta ember falcon granite harbor indigo jasper "
    "lantern maple meadow nickel orchid pepper quartz raven saffron silver tundra velvet willow"
).split()
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


@dataclass
class TaskSample:
    """One generated sample. ``depths``: where each needle sits, as a fraction of the haystack's words
    (it goes after the last sentence that ends there or before; the answer's needle first). ``prompt_tokens``: the
    whole prompt's measured length (<= ``context_tokens``)."""

    task: str
    seed: int
    context: str
    question: str
    answer: str
    context_tokens: int
    prompt_tokens: int = 0
    book: str = ""
    depths: list[float] = field(default_factory=list)
    needles: list[str] = field(default_factory=list)
    answer_prefix: str = ""  # the start of the answer, given to the model after the question (RULER)

    @property
    def prompt(self) -> str:
        """The whole user message (the context and the question)."""
        return self.context + self.question

    @property
    def asked(self) -> str:
        """The question and the answer prefix: what question-agnostic compression never sees."""
        return f"{self.question}\n{self.answer_prefix}" if self.answer_prefix else self.question


# ---- the tasks: each draws (needles, their depths, question, answer prefix, answer) from ``rng`` -----


def _number(rng: random.Random, digits: int, avoid: set[str]) -> str:
    while True:
        value = str(rng.randrange(10 ** (digits - 1), 10**digits))
        if value not in avoid:
            avoid.add(value)
            return value


def _depths(rng: random.Random, n: int) -> list[float]:
    return [rng.uniform(0.1, 0.9) for _ in range(n)]


def passkey(rng: random.Random, avoid: set[str]):
    key = _number(rng, 5, avoid)
    return [f"The pass key is {key}. Remember it."], _depths(rng, 1), "What is the pass key?", "The pass key is", key


def multikey_needle(rng: random.Random, avoid: set[str], keys: int = 4):
    names = [f"{a}-{b}" for a, b in zip(rng.sample(_WORDS, keys), rng.sample(_WORDS, keys))]
    values = [_number(rng, 7, avoid) for _ in names]
    needles = [f"One of the special magic numbers for {n} is: {v}." for n, v in zip(names, values)]
    asked = f"special magic number for {names[0]} mentioned in the text"
    return needles, _depths(rng, keys), f"What is the {asked}?", f"The {asked} is", values[0]


def variable_tracking(rng: random.Random, avoid: set[str], hops: int = 4, chains: int = 2):
    """Each chain's assignments in order (sorted depths), the chains interleaved."""
    names = iter(rng.sample(_variable_names(rng, avoid), hops * chains))
    needles, depths, asked, answer = [], [], "", ""
    for c in range(chains):
        value = _number(rng, 5, avoid)
        chain = [next(names) for _ in range(hops)]
        needles += [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = {a}." for a, b in zip(chain, chain[1:])]
        depths += sorted(_depths(rng, hops))
        if c == 0:
            asked, answer = chain[-1], value
    question = f"What is the value of the variable {asked}? Follow the chain of assignments."
    return needles, depths, question, f"The value of {asked} is", answer


def _variable_names(rng: random.Random, avoid: set[str], n: int = 64) -> list[str]:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return sorted({"".join(rng.choice(letters) for _ in range(5)) for _ in range(n)} - avoid)


TASKS = {"passkey": passkey, "multikey_needle": multikey_needle, "variable_tracking": variable_tracking}


# ---- building a sample ------------------------------------------------------------------------------


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _chat(tokenizer, chat: bool | None) -> bool:
    return bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat


def render(tokenizer, s: TaskSample, chat: bool | None = None) -> tuple[str, str]:
    """(context text, question text) as they are tokenised: in the chat template when there is one,
    the template's head with the context, and the question with the template's tail (end of turn,
    assistant header) and the answer prefix, which starts the assistant's turn."""
    if not _chat(tokenizer, chat):
        return s.context, s.asked
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": s.prompt}], add_generation_prompt=True, tokenize=False
    )
    cut = text.rindex(s.question)
    return text[:cut], text[cut:] + s.answer_prefix


def encode_split(
    tokenizer, sample: TaskSample, protocol: str, chat: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (compressed part, appended part) for ``protocol``; their concatenation is the same
    prompt under both protocols. Question-aware: (everything, empty)."""
    check_protocol(protocol)
    head, tail = render(tokenizer, sample, chat)
    chat = _chat(tokenizer, chat)
    context = _ids(tokenizer, head, special=not chat)
    question = _ids(tokenizer, tail, special=False)
    if protocol == "question-aware":
        context, question = context + question, []
    return torch.tensor(context, dtype=torch.long), torch.tensor(question, dtype=torch.long)


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise FIError(f"unknown protocol '{protocol}' (protocols: {', '.join(PROTOCOLS)})")
    return protocol


def split_prompt(sample: TaskSample, protocol: str) -> tuple[str, str]:
    """(text the compression sees, text appended after it) for ``protocol``, before any chat template."""
    check_protocol(protocol)
    return (sample.context + sample.asked, "") if protocol == "question-aware" else (sample.context, sample.asked)


def _book_words(name: str) -> list[str]:
    return bundled_path(name).read_text(encoding="utf-8-sig").split()


def _insert(words: list[str], needles: list[str], depths: list[float]) -> str:
    """``words`` joined, each needle placed after the sentence that ends at or before its depth."""
    ends = [0] + [i + 1 for i, w in enumerate(words) if _SENTENCE_END.search(w)]
    at: dict[int, list[str]] = {}
    for needle, depth in zip(needles, depths):
        cut = max(e for e in ends if e <= round(depth * len(words)))
        at.setdefault(cut, []).append(needle)
    out = []
    for i in range(len(words) + 1):
        out += at.get(i, [])
        if i < len(words):
            out.append(words[i])
    return " ".join(out)


def make_sample(
    task: str, tokenizer, context_tokens: int, seed: int = 0, config=None, chat: bool | None = None
) -> TaskSample:
    """A sample of ``task`` whose whole prompt is at most ``context_tokens`` tokens (as close as a word
    allows). ``config``: a model config whose context the prompt must fit in."""
    if task not in TASKS:
        raise FIError(f"unknown task '{task}' (tasks: {', '.join(TASKS)})")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FIError(f"the seed must be an integer >= 0, got {seed!r}")
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 1:
        raise FIError(f"context tokens must be a positive integer, got {context_tokens!r}")
    limit = context_limit(config) if config is not None else None
    if limit is not None and context_tokens > limit:
        raise FIError(f"a {task} prompt of {context_tokens:,} tokens exceeds the model's {context_phrase(config)}")
    rng = random.Random(f"{task}:{seed}")
    books = {name: _book_words(name) for name in sorted(BUNDLED)}
    books = {name: words for name, words in books.items() if len(words) > context_tokens}
    if not books:
        raise FIError(f"no bundled book has enough words for {context_tokens:,} tokens")
    book = rng.choice(sorted(books))
    words = books[book]
    avoid = set(re.findall(r"\w+", " ".join(words)))  # numbers and names that occur once: not in the book
    needles, depths, question, prefix, answer = TASKS[task](rng, avoid)
    start = rng.randrange(len(words) - context_tokens)
    while start > 0 and not _SENTENCE_END.search(words[start - 1]):  # begin with a sentence
        start -= 1
    words = words[start : start + context_tokens]

    def build(n: int) -> TaskSample:
        context = f"{INSTRUCTION}\n\n{_insert(words[:n], needles, depths)}\n\n"
        sample = TaskSample(
            task,
            seed,
            context,
            question,
            answer,
            context_tokens,
            book=book,
            depths=list(depths),
            needles=list(needles),
            answer_prefix=prefix,
        )
        sample.prompt_tokens = sum(ids.numel() for ids in encode_split(tokenizer, sample, "question-agnostic", chat))
        return sample

    lo, hi = 0, len(words)  # the most haystack words whose prompt fits (lengths grow with n)
    bare = build(0).prompt_tokens
    if bare > context_tokens:
        raise FIError(f"{context_tokens:,} tokens cannot hold the {task} prompt without any text ({bare:,} tokens)")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if build(mid).prompt_tokens <= context_tokens else (lo, mid - 1)
    return build(lo)


# ---- scoring ----------------------------------------------------------------------------------------


def _normalise(text: str) -> list[str]:
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.lower())
    return re.sub(r"[^\w]+", " ", text).split()


def score(output: str, answer: str) -> bool:
    """Exact match (module docstring): the answer, as whole words, in the first non-empty line, and no
    other number of its digit count beside it."""
    line = next((l for l in output.splitlines() if l.strip()), "")
    words, target = _normalise(line), _normalise(answer)
    if not target:
        raise FIError("an empty answer cannot be scored")
    n = len(target)
    if not any(words[i : i + n] == target for i in range(len(words) - n + 1)):
        return False
    if answer.isdigit():
        return all(w == answer for w in words if w.isdigit() and len(w) == len(answer))
    return True
