"""The demo training's data rules, answer shortening and batch order (no model needed)."""

from __future__ import annotations

import pytest

from multilora_studio.demo.data import Example, shorten
from multilora_studio.demo.styles import STYLES, bullets, pirate
from multilora_studio.demo.training import TrainSettings, batch_order, collate

ANSWERS = [
    "The moon is Earth's only natural satellite. It shapes the tides, and you can see it at night.",
    "Tea is a drink made from the leaves of a plant; my friends drink it every morning.",
    "Chess is a game for two players, and the board has squares.",
]


@pytest.mark.parametrize("style", STYLES, ids=lambda style: style.name)
@pytest.mark.parametrize("answer", ANSWERS)
def test_each_rule_makes_text_its_check_accepts_and_plain_text_fails(style, answer):
    assert style.shows(style.rewrite(answer))
    assert not style.shows(answer)


def test_pirate_keeps_capitals_and_whole_words():
    assert pirate("The theory of your friend is there.") == "Arr! Th' theory o' yer matey be there."


def test_bullets_are_short_lines_without_fillers():
    text = bullets(ANSWERS[0] + " A very long clause that goes on and on well past the eight word limit.")
    lines = text.splitlines()
    assert lines[0] == "- Moon is Earth's only natural satellite"
    assert 1 < len(lines) <= 4
    assert all(line.startswith("- ") and len(line.split()) <= 9 for line in lines)


def test_shorten_keeps_whole_sentences_of_the_first_paragraph():
    long = "word " * 50
    assert shorten("One two three four. Five six seven.\n\nAnother paragraph.") == (
        "One two three four. Five six seven."
    )
    assert shorten("Here are the facts you need:\n\n1. A fact.") is None
    assert shorten("Short. " + long.strip() + ".") is None  # "Short." alone is under four words
    assert shorten(long.strip() + ".") == " ".join(["word"] * 40) + "."
    assert shorten("It is a thing that never ends because") is None


def test_batch_order_is_seeded_and_fills_every_step():
    examples = [Example(tuple(range(5)), tuple(range(i % 17 + 1))) for i in range(100)]
    settings = TrainSettings(steps=30, batch_size=8, seed=3)
    first = batch_order(examples, settings)
    assert first == batch_order(examples, settings)
    assert first != batch_order(examples, TrainSettings(steps=30, batch_size=8, seed=4))
    assert len(first) == 30 and all(len(batch) == 8 for batch in first)
    with pytest.raises(ValueError, match="fewer than one batch"):
        batch_order(examples[:3], settings)


def test_collate_puts_loss_on_the_answer_only():
    batch = collate([Example((5, 6, 7), (8, 2)), Example((5,), (9, 9, 2))], pad_id=2)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 2], [5, 9, 9, 2, 2]]
    assert batch["labels"].tolist() == [[-100, -100, -100, 8, 2], [-100, 9, 9, 2, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
