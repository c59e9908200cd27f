"""Fill-in-the-middle prompts in the model's own format, read from its tokenizer's special
tokens: the code before the cursor, the code after it, and (where the family has them)
other files of the project in its repository markers, laid out as the model was trained
on them and as llama.cpp's /infill lays them out, at the token level:

    [bos] [extra files] PRE prefix SUF suffix MID [text after MID]     (most families)
    [bos] [extra files] SUF suffix PRE prefix [text after PRE]         (Codestral: SPM)

The model then writes the middle, and ends it with its end-of-sequence token or one of
its family's end markers (`ends`). Prompts of one file share every token up to the
cursor, so an editor's next request continues from the prompt cache.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from mlxserve.protocol.request import FileChunk


@dataclass(frozen=True)
class FimFormat:
    family: str
    prefix: str  # the marker tokens
    suffix: str
    middle: str | None  # None: the middle follows the prefix directly (SPM)
    suffix_first: bool = False
    repo: str | None = None  # repository-level markers, where the family has them
    file_sep: str | None = None
    ends: tuple[str, ...] = ()  # tokens that end a middle besides end-of-sequence


FORMATS = (
    FimFormat(
        "qwen",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        repo="<|repo_name|>",
        file_sep="<|file_sep|>",
        ends=("<|fim_pad|>", "<|file_sep|>", "<|endoftext|>", "<|repo_name|>"),
    ),
    FimFormat(
        "starcoder",
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        repo="<repo_name>",
        file_sep="<file_sep>",
        ends=("<fim_pad>", "<file_sep>", "<|endoftext|>"),
    ),
    FimFormat("codellama", "<PRE>", "<SUF>", "<MID>", ends=("<EOT>",)),
    # DeepSeek-Coder's markers are spelled with fullwidth bars, as its vocabulary has them
    FimFormat("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # noqa: RUF001
    FimFormat("codestral", "[PREFIX]", "[SUFFIX]", None, suffix_first=True),
)
PROJECT = "myproject\n"  # the repository name in a repo-level prompt (llama.cpp's)
CURRENT_FILE = "filename\n"  # the file being edited, in a repo-level prompt (llama.cpp's)
SNIPPET = "\n\n--- snippet ---\n\n"  # between extra files, where there are no file markers


@dataclass(frozen=True)
class Fim:
    """A tokenizer's FIM format with its marker ids."""

    format: FimFormat
    ids: dict[str, int]

    @property
    def stop_tokens(self) -> frozenset[int]:
        """The ids that end a middle besides end-of-sequence."""
        return frozenset(self.ids[end] for end in self.format.ends if end in self.ids)

    def prompt(
        self,
        tokenizer: Any,
        prefix: str,
        suffix: str,
        extra: tuple[FileChunk, ...] = (),
        after_middle: str = "",
    ) -> list[int]:
        fmt, ids = self.format, self.ids

        def text(value: str) -> list[int]:
            return list(tokenizer.encode(value, add_special_tokens=False)) if value else []

        tokens = [tokenizer.bos_token_id] if _adds_bos(tokenizer) else []
        tokens += self._extra(text, extra)
        head = [ids[fmt.prefix], *text(prefix)]
        tail = [ids[fmt.suffix], *text(suffix)]
        if fmt.suffix_first:
            return [*tokens, *tail, *head, *text(after_middle)]
        middle = [ids[fmt.middle]] if fmt.middle is not None else []
        return [*tokens, *head, *tail, *middle, *text(after_middle)]

    def _extra(self, text: Any, chunks: tuple[FileChunk, ...]) -> list[int]:
        if not chunks:
            return []
        fmt, ids = self.format, self.ids
        if fmt.repo in ids and fmt.file_sep in ids:
            repo, sep = ids[str(fmt.repo)], ids[str(fmt.file_sep)]
            tokens = [repo, *text(PROJECT)]
            for chunk in chunks:
                tokens += [sep, *text(chunk.filename + "\n"), *text(chunk.text)]
            return [*tokens, sep, *text(CURRENT_FILE)]
        return [t for chunk in chunks for t in text(SNIPPET + chunk.text)]


_FOUND: weakref.WeakKeyDictionary[Any, Fim | None] = weakref.WeakKeyDictionary()


def find_fim(tokenizer: Any) -> Fim | None:
    """The first format whose markers are all tokens of this tokenizer (None: the model
    has no FIM tokens); read once per tokenizer."""
    try:
        return _FOUND[tokenizer]
    except KeyError:
        pass
    vocab = tokenizer.get_vocab()
    found = None
    for fmt in FORMATS:
        markers = [m for m in (fmt.prefix, fmt.suffix, fmt.middle) if m is not None]
        if all(m in vocab for m in markers):
            names = [*markers, *(m for m in (fmt.repo, fmt.file_sep, *fmt.ends) if m)]
            found = Fim(fmt, {m: vocab[m] for m in names if m in vocab})
            break
    _FOUND[tokenizer] = found
    return found


def _adds_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer starts a text with its BOS token (CodeLlama's does)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    encoded = tokenizer.encode("a")
    return bool(encoded) and encoded[0] == bos
