"""The README's commands and Python blocks, run as pasted by a new user on the embedded model."""

from __future__ import annotations

import pytest

from tests.docs.examples import REPOSITORY, read_examples, runnable


@pytest.mark.slow(seconds=110)
def test_the_readme_runs_as_pasted(reader):
    examples = runnable(read_examples(REPOSITORY / "README.md"))
    assert examples, "the README has no example to run"
    for example in examples:
        reader.run(example)
