"""The Library's choices without a window, over a real library: what each action offers for the
selected adapter as it goes through its lifecycle, the base filter's entries, the answers read."""

from __future__ import annotations

from multilora_studio.gui.base_states import LOADED, BaseState
from multilora_studio.gui.workflows.library_selection import (
    SelectedActions,
    aliases_label,
    base_filter_entries,
    base_key,
    lifecycle_action,
    warm_list,
)


def test_the_selected_adapters_actions_follow_its_state(registry, tiny_base, tiny_adapters):
    nothing = SelectedActions.of(None)
    assert not nothing.selected and not nothing.retire_enabled and not nothing.alias_warm_enabled
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, max_rank=32)
    fresh = SelectedActions.of(record)
    assert fresh == SelectedActions(True, "Pin", "Retire", True, "Archive", "Warm at start", False)
    registry.set_pinned(record.name, True)
    registry.set_warm(record.name, True)
    registry.add_alias(record.name, "support")
    pinned = SelectedActions.of(registry.get(record.name))
    assert (pinned.pin, pinned.warm, pinned.alias_warm_enabled) == ("Unpin", "Not warm", True)
    registry.retire(record.name, "replaced by v2")
    retired = SelectedActions.of(registry.get(record.name))
    assert retired.retire == "Reactivate" and lifecycle_action(retired.retire) == "reactivate"
    registry.archive(record.name, "")
    archived = SelectedActions.of(registry.get(record.name))
    assert archived.archive == "Restore" and not archived.retire_enabled
    assert lifecycle_action(archived.archive) == "restore"


def test_aliases_name_what_their_first_use_reads(registry, tiny_base, tiny_adapters):
    for name in ("tiny-r4-qv", "tiny-r8-all"):
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    assert aliases_label(registry.get("tiny-r4-qv")) == "-"
    registry.add_alias("tiny-r4-qv", "support")
    registry.add_alias("tiny-r4-qv", "helpdesk")
    registry.set_alias_warm("support", warm_list(" tiny-r8-all , ,tiny-r4-qv"))
    assert aliases_label(registry.get("tiny-r4-qv")) == "helpdesk, support (warms tiny-r8-all, tiny-r4-qv)"


def test_the_base_filter_lists_the_librarys_bases_and_the_served_ones(registry, tiny_base, tiny_adapters):
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, max_rank=32)
    served = BaseState("other-base", "ab" * 32, LOADED, None, (), (), None, 1, None)
    entries = base_filter_entries([record], [served])
    mine = f"{tiny_base.name} (sha256 {tiny_base.digest[:12]})"
    assert {(e.label, e.key, e.name) for e in entries} == {
        (mine, base_key(record), tiny_base.name),
        (f"other-base (sha256 {'ab' * 6}), served", "ab" * 32, "other-base"),
    }
    assert base_key(record) == record.base_digest
