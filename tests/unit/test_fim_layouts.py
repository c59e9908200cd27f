"""The FIM prompt of each family the suite has no model of, laid out from its tokens as
llama.cpp lays it out: prefix-suffix-middle with the family's markers, Codestral's
suffix first, repository markers where the family has them, a snippet separator where
it has none; and no format for a tokenizer without FIM tokens."""

from __future__ import annotations

import pytest

from mlxserve.chat.fim import find_fim
from mlxserve.protocol.request import FileChunk


class Letters:
    """A tokenizer of the given special tokens plus one token per character."""

    bos_token_id = None

    def __init__(self, special: list[str]):
        self.special = {token: 1000 + i for i, token in enumerate(special)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        names = {v: k for k, v in self.special.items()}
        return "".join(names.get(i, chr(i)) for i in ids)


@pytest.mark.parametrize(
    ("special", "expected"),
    [
        (
            ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"],
            "<fim_prefix>a = <fim_suffix>\n<fim_middle>",
        ),
        (
            ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],  # noqa: RUF001
            "<｜fim▁begin｜>a = <｜fim▁hole｜>\n<｜fim▁end｜>",  # noqa: RUF001
        ),
        (["[PREFIX]", "[SUFFIX]"], "[SUFFIX]\n[PREFIX]a = "),
    ],
    ids=["starcoder", "deepseek", "codestral"],
)
def test_each_familys_layout(special, expected):
    tokenizer = Letters(special)
    fim = find_fim(tokenizer)
    assert fim is not None
    assert tokenizer.decode(fim.prompt(tokenizer, "a = ", "\n")) == expected


def test_the_ends_a_family_has_stop_it():
    tokenizer = Letters(["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"])
    fim = find_fim(tokenizer)
    assert fim is not None and fim.stop_tokens == {tokenizer.special["<file_sep>"]}


def test_other_files_without_repository_markers_are_snippets():
    tokenizer = Letters(["<PRE>", "<SUF>", "<MID>", "<EOT>"])
    fim = find_fim(tokenizer)
    assert fim is not None and fim.format.family == "codellama"
    extra = (FileChunk("a.py", "x = 1"), FileChunk("b.py", "y = 2"))
    prompt = tokenizer.decode(fim.prompt(tokenizer, "z = ", "", extra, after_middle="x"))
    assert prompt == (
        "\n\n--- snippet ---\n\nx = 1\n\n--- snippet ---\n\ny = 2<PRE>z = <SUF><MID>x"
    )


def test_no_fim_tokens_no_format():
    assert find_fim(Letters(["<|im_start|>", "<|im_end|>"])) is None
