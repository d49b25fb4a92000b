"""The user guides' commands and Python blocks, run as pasted by a new user on the embedded model
(the server and Python guides are in ``test_api_guide_examples.py``, so two workers share them)."""

from __future__ import annotations

import pytest

from tests.docs.examples import API_GUIDES, guides_with_examples, read_examples, runnable

GUIDES = [path for path in guides_with_examples() if path.name not in API_GUIDES]


@pytest.mark.parametrize("path", GUIDES, ids=lambda path: path.name)
def test_a_guide_runs_as_pasted(reader, path):
    for example in runnable(read_examples(path)):
        reader.run(example)


def test_the_api_guides_have_examples_to_run():
    assert set(API_GUIDES) <= {path.name for path in guides_with_examples()}
