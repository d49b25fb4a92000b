"""Merging into a quantized base is refused by name: its projections are packed integers or FP8
values with scales, which a float merge would silently drop or misread."""

from __future__ import annotations

import pytest

from multilora_studio.merge import MergeError, merge_and_export
from tests.fixtures import AdapterSpec, build_adapter
from tests.merge.test_merge_export import request_for
from tests.quant_fixtures import build_quant_base, build_quantized


@pytest.mark.parametrize("kind", ["awq", "fp8-channel"])
def test_a_quantized_base_is_refused_and_nothing_written(tokenizer_dir, tmp_path, kind):
    base = build_quant_base(tokenizer_dir, tmp_path / "float")
    quantized, _ = build_quantized(base, kind, tmp_path / kind)
    adapter = build_adapter(base, AdapterSpec("qv", 4, 8, ("q_proj", "v_proj"), 41), tmp_path / "qv")
    out = tmp_path / "out"
    method = "awq" if kind == "awq" else "compressed-tensors"
    with pytest.raises(
        MergeError, match=rf"is a quantized checkpoint \({method}\); merge the adapter into the float"
    ):
        merge_and_export(request_for(quantized, adapter, out))
    assert not out.exists() and not out.with_name("out.partial").exists()
