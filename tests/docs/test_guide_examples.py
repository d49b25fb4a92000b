"""The user guides' commands and Python blocks, run as pasted by a new user on the embedded model."""

from __future__ import annotations

import pytest

from tests.docs.examples import REPOSITORY, read_examples, runnable, user_docs

GUIDES = [path for path in user_docs() if path.name != "README.md" and runnable(read_examples(path))]


@pytest.mark.parametrize("path", GUIDES, ids=lambda path: path.name)
def test_a_guide_runs_as_pasted(reader, path):
    for example in runnable(read_examples(path)):
        reader.run(example)


def test_the_guides_with_examples_are_found():
    assert REPOSITORY / "docs" / "server.md" in GUIDES
