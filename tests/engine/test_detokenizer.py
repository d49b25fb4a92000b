"""Incremental detokenization: deltas add up to the text, stop strings, split UTF-8 characters.

Uses the default model's real byte-level BPE tokenizer, where characters outside ASCII
are often split over several tokens.
"""

from __future__ import annotations

import random

import pytest

from multilora_studio.engine.text.detokenizer import IncrementalDetokenizer

SPLIT_TEXTS = [
    "héllo 日本語 😀 emoji",
    "👍🏽 thumbs, ßtraße → Ωmega",
    "数学とコンピュータ",
]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def stream(
    tokenizer, ids: list[int], stop: tuple[str, ...] = ()
) -> tuple[list[str], IncrementalDetokenizer, bool]:
    """Feed ``ids`` as the engine does: a delta after each token, the rest when finished."""
    detok = IncrementalDetokenizer(tokenizer, stop)
    deltas = []
    stopped = False
    for token in ids:
        if detok.add(token):
            stopped = True
            break
        deltas.append(detok.delta(finished=False))
    deltas.append(detok.delta(finished=True))
    return deltas, detok, stopped


def test_split_characters_are_really_split_by_this_tokenizer(tokenizer):
    pieces = [tokenizer.decode([t]) for text in SPLIT_TEXTS for t in encode(tokenizer, text)]
    assert sum("\ufffd" in piece for piece in pieces) >= 5


@pytest.mark.parametrize(
    "text",
    ["Hello world", "a\n\nb  c\t", "Once upon a time, there was a dragon.", *SPLIT_TEXTS],
)
def test_concatenated_deltas_are_the_decoded_text(tokenizer, text):
    ids = encode(tokenizer, text)
    deltas, detok, stopped = stream(tokenizer, ids)
    assert not stopped
    assert "".join(deltas) == detok.text == tokenizer.decode(ids) == text
    assert all("\ufffd" not in delta for delta in deltas)  # never half a character


def test_without_stop_strings_text_is_streamed_at_once(tokenizer):
    ids = encode(tokenizer, "Hello world")
    detok = IncrementalDetokenizer(tokenizer, ())
    assert detok.add(ids[0]) is False
    assert detok.delta(False) == "Hello"
    detok.add(ids[1])
    assert detok.delta(False) == " world"
    assert detok.delta(True) == ""


def test_a_split_character_is_emitted_whole_once_its_last_byte_arrives(tokenizer):
    ids = encode(tokenizer, "ok 😀!")
    emoji_tokens = [i for i, t in enumerate(ids) if "\ufffd" in tokenizer.decode([t])]
    assert len(emoji_tokens) >= 2
    detok = IncrementalDetokenizer(tokenizer, ())
    emitted = []
    for token in ids:
        detok.add(token)
        emitted.append(detok.delta(False))
    assert "".join(emitted) == "ok 😀!"
    assert "😀" in emitted[emoji_tokens[-1]]
    assert all(emitted[i] == "" for i in emoji_tokens[:-1])


def test_finishing_in_the_middle_of_a_character_keeps_what_decode_gives(tokenizer):
    ids = encode(tokenizer, "ok 😀")
    cut = ids[:-1]  # e.g. max_tokens ran out before the character was complete
    expected = tokenizer.decode(cut)
    assert expected.endswith("\ufffd") and expected.startswith("ok")
    deltas, detok, _ = stream(tokenizer, cut)
    assert "".join(deltas) == detok.text == expected
    assert all("\ufffd" not in d for d in deltas[:-1])


def test_special_tokens_add_no_text(tokenizer):
    eos = tokenizer.eos_token_id
    ids = [*encode(tokenizer, "Hi"), eos, *encode(tokenizer, " there"), eos]
    deltas, detok, _ = stream(tokenizer, ids)
    assert "".join(deltas) == detok.text == "Hi there"


def test_stop_string_inside_one_token_cuts_the_text_before_it(tokenizer):
    ids = encode(tokenizer, "Hello world STOP here")
    deltas, detok, stopped = stream(tokenizer, ids, ("STOP",))
    assert stopped
    assert "".join(deltas) == detok.text == "Hello world "


def test_stop_string_spanning_tokens_is_found_and_never_leaked(tokenizer):
    text = "The quick brown fox jumps"
    stop = "ck brown f"
    ids = encode(tokenizer, text)
    assert all(stop not in tokenizer.decode([t]) for t in ids)  # it does span tokens
    deltas, detok, stopped = stream(tokenizer, ids, (stop,))
    assert stopped
    assert "".join(deltas) == detok.text == "The qui"
    assert len(detok.ids) < len(ids)  # stopped as soon as the stop string was complete


def test_text_is_held_back_while_it_could_still_start_a_stop_string(tokenizer):
    ids = encode(tokenizer, "Hello world")
    detok = IncrementalDetokenizer(tokenizer, ("XYZW", "Q"))
    detok.add(ids[0])
    assert detok.delta(False) == "He"  # "llo" could be the start of a 4-character stop
    detok.add(ids[1])
    assert detok.delta(False) == "llo wo"
    assert detok.delta(True) == "rld"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    ids = encode(tokenizer, "one two three four")
    deltas, detok, stopped = stream(tokenizer, ids, ("four", "two", "three"))
    assert stopped and "".join(deltas) == detok.text == "one "


def test_stop_string_made_of_a_split_character(tokenizer):
    ids = encode(tokenizer, "café 日本語 rest")
    deltas, detok, stopped = stream(tokenizer, ids, ("本",))
    assert stopped
    assert "".join(deltas) == detok.text == "café 日"


def test_stop_string_at_the_very_start(tokenizer):
    ids = encode(tokenizer, "STOP and more")
    deltas, detok, stopped = stream(tokenizer, ids, ("STOP",))
    assert stopped and deltas == [""] and detok.text == ""


def test_tokens_after_a_stop_change_nothing(tokenizer):
    ids = encode(tokenizer, "say STOP now and then")
    detok = IncrementalDetokenizer(tokenizer, ("STOP",))
    results = [detok.add(t) for t in ids]
    assert results.index(True) < len(ids) - 1
    assert all(results[results.index(True) :])
    assert detok.text == "say " and detok.delta(True) == "say "


def test_random_texts_and_stop_strings_match_a_full_decode(tokenizer):
    rng = random.Random(5)
    alphabet = [*"ab cdSTOP\n.,!", "é", "日", "本", "😀", "👍🏽", "ß", "→", "  ", "\t", "ü", "Ω"]
    checked_stops = 0
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        ids = encode(tokenizer, text)
        full = tokenizer.decode(ids)
        stop: tuple[str, ...] = ()
        if rng.random() < 0.7 and len(full) > 1:
            start = rng.randrange(len(full))
            stop = (full[start : rng.randint(start + 1, min(len(full), start + 6))],)
        if rng.random() < 0.5:
            ids = ids[: rng.randint(1, len(ids))]  # cut anywhere, even inside a character
            full = tokenizer.decode(ids)
        deltas, detok, stopped = stream(tokenizer, ids, stop)
        expected = full if not stop or stop[0] not in full else full[: full.index(stop[0])]
        assert detok.stopped == (expected != full)  # a stop may show only in the final flush
        assert "".join(deltas) == detok.text == expected, (text, stop)
        assert all("\ufffd" not in d for d in deltas[:-1] if "\ufffd" not in text), (text, deltas)
        checked_stops += stopped
    assert checked_stops > 50
