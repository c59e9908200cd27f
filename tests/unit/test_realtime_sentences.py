"""How a Realtime answer is cut for speech as it streams: whole sentences, long run-on
text from its last space, nothing dropped, and no synthesis for a piece with no words."""

from __future__ import annotations

from mlxserve.api.realtime.speaker import LONGEST_FIRST_PIECE, LONGEST_PIECE, Sentences, speak


def pieces(text: str, step: int) -> list[str]:
    sentences = Sentences()
    out = []
    for start in range(0, len(text), step):
        out += sentences.feed(text[start : start + step])
    return out + sentences.rest()


def test_sentences_come_out_whole_and_nothing_is_dropped():
    text = "Hello there. How are you?\nFine: thanks! And the rest"
    for step in (1, 3, 7, len(text)):
        got = pieces(text, step)
        assert "".join(got) == text
    assert pieces(text, 1) == [
        "Hello there. ",
        "How are you?\n",
        "Fine: ",
        "thanks! ",
        "And the rest",
    ]


def test_run_on_text_is_cut_at_its_last_space():
    text = "word " * 100
    got = pieces(text, 5)
    assert "".join(got) == text
    assert len(got[0]) <= LONGEST_FIRST_PIECE + 5  # the first is what the user waits for
    assert all(len(piece) <= LONGEST_PIECE + 5 for piece in got) and len(got) > 2


def test_a_piece_without_words_is_not_spoken():
    assert list(speak(None, '"', lambda: False)) == []  # type: ignore[arg-type]
    assert list(speak(None, " . ", lambda: False)) == []  # type: ignore[arg-type]
