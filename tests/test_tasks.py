"""Long-context task generators and exact-match scoring: mechanics with a whitespace tokenizer,
the real SmolLM2 tokenizer (chat template) in the ``smollm`` tests."""

from __future__ import annotations

import re

import pytest
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.tasks import PROTOCOLS, TASKS, TaskSample, encode_split, make_sample, score, split_prompt


class Words:
    """One token per whitespace-separated word (a BOS id 0 with special tokens); no chat template."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([0] if add_special_tokens else []) + [len(w) for w in text.split()]}


WORDS = Words()


class Config:
    max_position_embeddings = 1024


def occurrences(answer: str, text: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(answer)}(?!\w)", text))


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_sample_and_seeds_differ(task):
    a, b = make_sample(task, WORDS, 400, seed=3), make_sample(task, WORDS, 400, seed=3)
    assert a == b
    others = [make_sample(task, WORDS, 400, seed=s) for s in range(4, 8)]
    assert all(o.answer != a.answer and o.context != a.context for o in others)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", range(6))
def test_answer_once_in_context_and_length_fits(task, seed):
    s = make_sample(task, WORDS, 600, seed=seed)
    assert occurrences(s.answer, s.context) == 1
    assert occurrences(s.answer, s.question) == 0
    assert all(n in s.context for n in s.needles)
    assert s.context_tokens - 30 <= s.prompt_tokens <= s.context_tokens  # within a sentence's worth
    assert s.prompt_tokens == len(WORDS(s.context + s.asked)["input_ids"])
    assert occurrences(s.answer, s.asked) == 0
    assert all(0.1 <= d <= 0.9 for d in s.depths)


@pytest.mark.parametrize("seed", range(6))
def test_multikey_has_distractor_keys(seed):
    s = make_sample("multikey_needle", WORDS, 600, seed=seed)
    pairs = re.findall(r"special magic numbers for ([\w-]+) is: (\d+)\.", s.context)
    assert len(pairs) == 4 and len({k for k, _ in pairs}) == 4 and len({v for _, v in pairs}) == 4
    asked = re.search(r"number for ([\w-]+) mentioned", s.question).group(1)
    assert dict(pairs)[asked] == s.answer
    assert all(occurrences(v, s.context) == 1 for _, v in pairs)


@pytest.mark.parametrize("seed", range(6))
def test_variable_chain_resolves_to_the_answer(seed):
    """Parse the assignments back out of the text and evaluate them in reading order."""
    s = make_sample("variable_tracking", WORDS, 600, seed=seed)
    values = {}
    for name, rhs in re.findall(r"VAR ([A-Z]+) = (\w+)\.", s.context):
        assert name not in values
        values[name] = rhs if rhs.isdigit() else values[rhs]  # a use before its assignment raises KeyError
    asked = re.search(r"variable ([A-Z]+)\?", s.question).group(1)
    assert values[asked] == s.answer
    assert len(values) == 8 and len(set(values.values())) == 2  # a distractor chain with its own value


@pytest.mark.parametrize("n", [120, 333, 1000])
def test_length_targets(n):
    s = make_sample("passkey", WORDS, n, seed=1)
    assert n - 30 <= s.prompt_tokens <= n


def test_split_prompt_protocols():
    s = make_sample("passkey", WORDS, 300, seed=0)
    assert split_prompt(s, "question-aware") == (s.context + "What is the pass key?\nThe pass key is", "")
    context, question = split_prompt(s, "question-agnostic")
    assert context == s.context and question == "What is the pass key?\nThe pass key is" and s.answer in context
    assert "pass key?" not in context
    aware, agnostic = encode_split(WORDS, s, "question-aware"), encode_split(WORDS, s, "question-agnostic")
    assert aware[1].numel() == 0 and agnostic[1].numel() > 0
    assert torch.equal(aware[0], torch.cat(agnostic))  # the same prompt; only the compressed part differs


# ---- scoring ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output, answer, expected",
    [
        ("12345", "12345", True),
        ("The pass key is 12345.", "12345", True),  # punctuation around it
        ("  \n\n12345!\nmore text", "12345", True),  # the first non-empty line
        ("**12345**", "12345", True),
        ("12345 12345 12345", "12345", True),  # repeated
        ("The pass key is 12,345.", "12345", True),  # thousands separator
        ("123456", "12345", False),  # whole numbers only
        ("012345", "12345", False),
        ("1234", "12345", False),
        ("The pass key is 54321.", "12345", False),
        ("", "12345", False),  # absent
        ("I don't know.", "12345", False),
        ("I think\nthe answer is 12345", "12345", False),  # not on the first line
        ("12345 or 67890", "12345", False),  # a hedge among candidates
        ("12345, the 3rd one", "12345", True),  # other numbers of another length are fine
        ("VAR X = 1234567.", "1234567", True),
        ("Amber-falcon", "amber-falcon", True),  # words: case and punctuation do not matter
        ("amber falcons", "amber-falcon", False),
    ],
)
def test_score(output, answer, expected):
    assert score(output, answer) is expected


# ---- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: make_sample("needle", WORDS, 500),
            "unknown task 'needle' (tasks: passkey, multikey_needle, variable_tracking)",
        ),
        (lambda: make_sample("passkey", WORDS, 2000, config=Config()), "exceeds the model's context of 1,024 tokens"),
        (lambda: make_sample("passkey", WORDS, 20), "cannot hold the passkey prompt"),
        (lambda: make_sample("passkey", WORDS, 0), "context tokens must be a positive integer"),
        (lambda: make_sample("passkey", WORDS, 500, seed=-1), "the seed must be an integer >= 0"),
        (lambda: make_sample("passkey", WORDS, 10**6), "no bundled book has enough words"),
        (lambda: split_prompt(make_sample("passkey", WORDS, 200), "aware"), "unknown protocol 'aware'"),
        (lambda: encode_split(WORDS, make_sample("passkey", WORDS, 200), "blind"), "unknown protocol 'blind'"),
        (lambda: score("12345", " . "), "an empty answer cannot be scored"),
    ],
)
def test_bad_input_one_line(call, message):
    with pytest.raises(FIError) as err:
        call()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_registry_and_protocols():
    assert set(TASKS) == {"passkey", "multikey_needle", "variable_tracking"}
    assert PROTOCOLS == ("question-aware", "question-agnostic")
    assert isinstance(make_sample("passkey", WORDS, 200), TaskSample)


# ---- the real tokenizer --------------------------------------------------------------------------------


@pytest.mark.smollm
@pytest.mark.parametrize("task", TASKS)
def test_smollm_prompt_fits_and_splits(smollm, task):
    tok = smollm.tokenizer
    s = make_sample(task, tok, 1024, seed=2, config=smollm.config)
    assert s == make_sample(task, tok, 1024, seed=2, config=smollm.config)
    assert 1000 <= s.prompt_tokens <= 1024 and occurrences(s.answer, s.context) == 1
    head, tail = encode_split(tok, s, "question-agnostic")
    assert head.numel() + tail.numel() == s.prompt_tokens
    assert s.question not in tok.decode(head) and s.answer in tok.decode(head)
    assert tok.decode(tail).startswith(s.question) and "assistant" in tok.decode(tail)
    assert tok.decode(tail).endswith(f"assistant\n{s.answer_prefix}")
    assert torch.equal(encode_split(tok, s, "question-aware")[0], torch.cat([head, tail]))
    with pytest.raises(FIError, match="exceeds the model's context of 8,192 tokens"):
        make_sample(task, tok, 9000, seed=2, config=smollm.config)
