"""The Python API, server and lm-eval guides' examples, run as pasted by a new user on the embedded model."""

from __future__ import annotations

import pytest

from tests.docs.examples import API_GUIDES, guides_with_examples, read_examples, runnable

GUIDES = [path for path in guides_with_examples() if path.name in API_GUIDES]


@pytest.mark.parametrize("path", GUIDES, ids=lambda path: path.name)
def test_an_api_guide_runs_as_pasted(reader, path):
    for example in runnable(read_examples(path)):
        reader.run(example)
