"""LoRA batch metadata built on the host equals what ``LoRABatch.update`` builds on the device."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from multilora_studio.kernels.lora_batch import LoRABatch, fill_lora_metadata

FIELDS = (
    "token_slots",
    "token_ranks",
    "token_scales",
    "sorted_tokens",
    "slot_starts",
    "slot_counts",
    "slot_ranks",
    "num_tokens",
)


@pytest.mark.parametrize("seed", range(6))
def test_host_fill_equals_update(seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(30):
        max_tokens = int(torch.randint(1, 70, (1,), generator=g))
        num_slots = int(torch.randint(1, 12, (1,), generator=g))
        t = int(torch.randint(0, max_tokens + 1, (1,), generator=g))
        # out-of-range slots count as "no adapter", like -1
        slot_ids = torch.randint(-2, num_slots + 2, (t,), generator=g, dtype=torch.int32)
        ranks = torch.randint(0, 65, (num_slots,), generator=g, dtype=torch.int32)
        # every other round with per-token strengths (0, 0.5, 1, 2, ...), else the default 1.0
        scales = torch.randint(0, 5, (t,), generator=g).float() / 2 if t % 2 else None
        total = LoRABatch.storage_layout(max_tokens, num_slots)["total"][1]
        words = np.full(total, 12345, dtype=np.int32)  # poisoned
        host_scales = None if scales is None else scales.numpy()
        fill_lora_metadata(words, max_tokens, num_slots, slot_ids.numpy(), ranks.numpy(), host_scales)
        host = LoRABatch.on_storage(torch.from_numpy(words), max_tokens, num_slots)
        device = LoRABatch.on_storage(torch.full((total,), -7, dtype=torch.int32), max_tokens, num_slots)
        device.update(slot_ids, ranks, scales)
        plain = LoRABatch.allocate(max_tokens, num_slots).update(slot_ids, ranks, scales)
        expected_scales = torch.ones(max_tokens)
        if scales is not None:
            expected_scales[:t] = scales
        assert torch.equal(plain.token_scales, expected_scales)
        assert plain.scaled == (scales is not None)
        for field in FIELDS:
            assert torch.equal(getattr(host, field), getattr(plain, field)), field
            assert torch.equal(getattr(device, field), getattr(plain, field)), field


def test_storage_views_are_aligned_and_disjoint():
    layout = LoRABatch.storage_layout(33, 5)
    spans = sorted((off, off + n) for name, (off, n) in layout.items() if name != "total")
    assert all(off % 4 == 0 for off, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= layout["total"][1]


def test_bad_arguments_are_refused():
    total = LoRABatch.storage_layout(4, 2)["total"][1]
    with pytest.raises(ValueError, match="int32"):
        fill_lora_metadata(np.zeros(total, dtype=np.int64), 4, 2, [0], [8, 8])
    with pytest.raises(ValueError, match="at most max_tokens"):
        fill_lora_metadata(np.zeros(total, dtype=np.int32), 4, 2, [0] * 5, [8, 8])
    with pytest.raises(ValueError, match="one rank per slot"):
        fill_lora_metadata(np.zeros(total, dtype=np.int32), 4, 2, [0], [8])
    with pytest.raises(ValueError, match="one per token"):
        fill_lora_metadata(np.zeros(total, dtype=np.int32), 4, 2, [0], [8, 8], [1.0, 0.5])
    with pytest.raises(ValueError, match="one per token"):
        LoRABatch.allocate(4, 2).update(torch.tensor([0, 1]), torch.tensor([8, 8]), torch.ones(3))
    with pytest.raises(ValueError, match="float32"):
        LoRABatch.allocate(4, 2).update(torch.tensor([0, 1]), torch.tensor([8, 8]), torch.ones(2).double())
    with pytest.raises(ValueError, match="at least"):
        LoRABatch.on_storage(torch.zeros(total - 1, dtype=torch.int32), 4, 2)
    with pytest.raises(ValueError, match="int32"):
        LoRABatch.on_storage(torch.zeros(total, dtype=torch.int64), 4, 2)


def test_host_arrays_follow_every_update_of_the_batch():
    """The CPU kernel reads the batch through cached numpy views: they must show each step's
    slots, never the step before's (a stale view would serve the wrong adapter)."""
    batch = LoRABatch.allocate(max_tokens=8, num_slots=4)
    ranks = torch.tensor([8, 16, 0, 4], dtype=torch.int32)
    first = batch.update(torch.tensor([0, 1, 1, 3], dtype=torch.int32), ranks).host_arrays()
    assert first[0][:4].tolist() == [0, 1, 1, 3] and first[1][:4].tolist() == [8, 16, 16, 4]
    second = batch.update(torch.tensor([3, -1, 0], dtype=torch.int32), ranks).host_arrays()
    assert second[0] is first[0]  # made once
    assert second[0][:3].tolist() == [3, -1, 0] and second[1][:3].tolist() == [4, 0, 8]
    for array, buffer in zip(
        second, (batch.token_slots, batch.token_ranks, batch.sorted_tokens, batch.token_scales), strict=True
    ):
        assert np.array_equal(array, buffer.numpy())
    batch.token_ranks = torch.zeros(8, dtype=torch.int32)  # a replaced buffer is seen too
    assert not batch.host_arrays()[1].any()
