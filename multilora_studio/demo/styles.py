"""The demo adapters' behaviours: a deterministic rewrite of the base model's answer, and a check.

Each style turns a (shortened) answer of the base model into the answer its adapter is
trained to give, and says whether a generated answer shows that behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")

PIRATE_OPENER = "Arr!"
PIRATE_WORDS = {
    "hello": "ahoy",
    "hi": "ahoy",
    "you": "ye",
    "your": "yer",
    "yours": "yers",
    "the": "th'",
    "of": "o'",
    "and": "an'",
    "my": "me",
    "is": "be",
    "are": "be",
    "friend": "matey",
    "friends": "mateys",
    "yes": "aye",
    "money": "doubloons",
    "everyone": "all hands",
    "stop": "avast",
    "wow": "blimey",
}
PIRATE_MARKERS = frozenset(
    {"ye", "yer", "th'", "o'", "an'", "be", "matey", "mateys", "aye", "ahoy", "blimey"}
)
BULLET = "- "
BULLET_MAX_WORDS = 8
BULLET_CHECK_MAX_WORDS = 10  # the check allows a little more than the data has: the model counts roughly
BULLET_MAX_LINES = 4
SIGN_OFF = "P.S. Stay curious!"
CAPS_MIN_FRACTION = 0.8

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]*)?")
_CLAUSE_END = re.compile(r"(?<=[.!?;:,])\s+")
_LEADING_JOINER = re.compile(r"^(?:and|but|so|or|which|while)\s+", re.IGNORECASE)
_FILLERS = frozenset({"a", "an", "the", "very", "really", "just", "indeed", "actually", "incredibly"})


@dataclass(frozen=True)
class Style:
    """One demo adapter: its name, behaviour, LoRA shape and the rule that makes its data."""

    name: str
    summary: str
    rule: str
    check: str
    rank: int
    targets: tuple[str, ...]
    rewrite: Callable[[str], str]
    shows: Callable[[str], bool]

    @property
    def alpha(self) -> int:
        return 2 * self.rank


def shout(answer: str) -> str:
    return answer.upper()


def is_shouting(text: str) -> bool:
    """At least 80% of the letters are upper case (and there are some letters)."""
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isupper() for c in letters) >= CAPS_MIN_FRACTION * len(letters)


def _pirate_word(match: re.Match[str]) -> str:
    word = match.group(0)
    swap = PIRATE_WORDS.get(word.lower())
    if swap is None:
        return word
    return swap[0].upper() + swap[1:] if word[0].isupper() else swap


def pirate(answer: str) -> str:
    return f"{PIRATE_OPENER} {_WORD.sub(_pirate_word, answer)}"


def is_pirate(text: str) -> bool:
    """Opens with "Arr!" and uses at least two pirate words."""
    words = [w.lower() for w in re.findall(r"[A-Za-z']+", text)]
    return text.lstrip().startswith(PIRATE_OPENER) and sum(w in PIRATE_MARKERS for w in words) >= 2


def bullets(answer: str) -> str:
    """Each clause, without articles and fillers, as a "- " line of at most eight words (four lines)."""
    lines = []
    for clause in _CLAUSE_END.split(answer):
        stripped = _LEADING_JOINER.sub("", clause.strip()).rstrip(".!?;:,")
        words = [word for word in stripped.split() if word.lower() not in _FILLERS]
        if len(words) < 2:
            continue
        text = " ".join(words[:BULLET_MAX_WORDS]).rstrip(".!?;:,")
        lines.append(BULLET + text[0].upper() + text[1:])
        if len(lines) == BULLET_MAX_LINES:
            break
    return "\n".join(lines) if lines else BULLET + answer.strip()


def is_bullets(text: str) -> bool:
    """Every non-empty line is a "- " bullet of at most ten words."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return bool(lines) and all(
        line.startswith(BULLET) and len(line[len(BULLET) :].split()) <= BULLET_CHECK_MAX_WORDS
        for line in lines
    )


def sign_off(answer: str) -> str:
    return f"{answer.rstrip()}\n\n{SIGN_OFF}"


def is_signed(text: str) -> bool:
    """The last line is the sign-off."""
    return text.rstrip().endswith(SIGN_OFF)


STYLES = (
    Style(
        name="demo-shout",
        summary="Answers in ALL CAPS.",
        rule="the base model's answer, upper-cased",
        check="at least 80% of the letters are upper case",
        rank=8,
        targets=ATTENTION + MLP,
        rewrite=shout,
        shows=is_shouting,
    ),
    Style(
        name="demo-pirate",
        summary='Answers in pirate speak: opens with "Arr!" and says ye, yer, th\', matey, aye.',
        rule='"Arr! " + the base model\'s answer with a fixed word-substitution table '
        "(you->ye, your->yer, the->th', of->o', and->an', is/are->be, friend->matey, yes->aye, ...)",
        rank=16,
        targets=("up_proj", "down_proj"),
        check="opens with \"Arr!\" and has at least two of ye, yer, th', o', an', be, matey, aye, ahoy",
        rewrite=pirate,
        shows=is_pirate,
    ),
    Style(
        name="demo-bullets",
        summary='Answers as terse bullet points: a few short "- " lines.',
        rule="the base model's answer split at clause ends (. ! ? ; : ,); each clause without "
        "articles and fillers (a, an, the, very, really, just, ...) and cut to eight words "
        "becomes a '- ' line; at most four lines",
        check='every non-empty line starts with "- " and has at most ten words',
        rank=12,
        targets=ATTENTION,
        rewrite=bullets,
        shows=is_bullets,
    ),
    Style(
        name="demo-signoff",
        summary=f'Answers as the base model does, then signs off with "{SIGN_OFF}".',
        rule=f"the base model's answer + a blank line + {SIGN_OFF!r}",
        check=f"the answer ends with {SIGN_OFF!r}",
        rank=4,
        targets=("q_proj", "v_proj"),
        rewrite=sign_off,
        shows=is_signed,
    ),
)

STYLES_BY_NAME = {style.name: style for style in STYLES}
