"""Compare's column choices without a window: the list of every base and its adapters, ticks that
survive a base pick, the strength sweep, the slot warning, own settings, and what is remembered."""

from __future__ import annotations

from multilora_studio.gui.workflows.compare_choices import ENTRIES, TICKS, AdapterChoices
from multilora_studio.gui.workflows.compare_session import CompareSession
from multilora_studio.run_records import ColumnOverrides
from tests.workflows.conftest import ADAPTERS, MAX_LORAS


def test_every_base_is_listed_and_ticks_survive_picking_one(two_bases):
    choices = AdapterChoices(lambda: two_bases)
    first = two_bases.primary
    entries = choices.entries()
    assert [e.name for e in entries] == ["base", *sorted(ADAPTERS), "tiny-copy", "tiny-r8-attn"]
    assert [e.label for e in entries][:2] == [f"base ({first})", f"tiny-r16-mlp  · {first}"]
    assert entries[-2].label == "tiny-copy (base model)"

    seen: list[str] = []
    choices.changed.connect(seen.append)
    choices.tick(["base", "tiny-r8-attn"])
    choices.pick_base(first)
    assert seen == [TICKS, "picked_base"]
    assert choices.ticked() == ["base"]  # tiny-r8-attn is not listed: not sent, still wanted
    choices.tick_all(True)
    assert choices.ticked() == ["base", *sorted(ADAPTERS)]
    choices.pick_base(None)
    assert choices.ticked() == ["base", *sorted(ADAPTERS), "tiny-r8-attn"]
    choices.tick_all(False)
    assert choices.ticked() == [] and choices.wanted == set()
    choices.pick_base("no-such-base")
    assert choices.picked_base is None


def test_a_sweep_ticks_the_adapters_base_and_its_strengths_listed_after_it(two_bases, registry):
    session = CompareSession(lambda: two_bases, registry)
    choices = session.choices
    told: list[tuple[str, str]] = []
    session.told.connect(lambda text, kind: told.append((text, kind)))
    session.sweep_selected(None)
    assert told == [("Select an adapter to sweep its strength.", "warning")]
    choices.tick(["tiny-copy", "tiny-r8-attn"])
    assert choices.sweep_target("tiny-copy") == "tiny-r8-attn"  # a base selected: the first ticked adapter
    assert choices.sweep_target("tiny-r8-all x0.5") == "tiny-r8-all"
    session.sweep_selected("tiny-r8-attn")
    assert choices.ticked() == ["tiny-copy", "tiny-r8-attn", "tiny-r8-attn x0.25", "tiny-r8-attn x0.5"]
    choices.sweep("tiny-r4-qv")  # an adapter of the first base: its base is the column 'base'
    assert choices.ticked() == ["base", "tiny-r4-qv", "tiny-r4-qv x0.25", "tiny-r4-qv x0.5"]


def test_a_base_with_more_ticked_adapters_than_slots_is_warned_about(pool, two_bases):
    one = AdapterChoices(lambda: pool)
    one.tick(["base", *ADAPTERS[:MAX_LORAS]])
    assert one.slot_warning() is None
    one.tick(["base", *ADAPTERS])
    warning = one.slot_warning()
    assert warning is not None and warning.startswith(
        f"3 adapters ticked but the engine has {MAX_LORAS} GPU slots"
    )
    two = AdapterChoices(lambda: two_bases)
    two.choose(["tiny-r4-qv", "tiny-r4-qv x0.5", "tiny-r8-all"])  # a strength column takes a slot too
    assert f"the engine of {two_bases.primary} has {MAX_LORAS}" in (two.slot_warning() or "")
    assert AdapterChoices(lambda: None).slot_warning() is None


def test_own_settings_mark_their_entry_and_everything_is_remembered(pool, store):
    choices = AdapterChoices(lambda: pool)
    seen: list[str] = []
    choices.changed.connect(seen.append)
    own = ColumnOverrides(temperature=0.5, stop=("\n",))
    choices.set_own_settings("tiny-r4-qv", own)
    assert seen == [ENTRIES]
    assert [e.name for e in choices.entries() if e.own_settings] == ["tiny-r4-qv"]
    choices.choose(["base", "tiny-r8-all x0.5"])
    choices.save(store)
    assert store["compare/adapters"] == ["base", "tiny-r8-all x0.5"]

    again = AdapterChoices(lambda: pool)
    again.restore(store)
    assert again.own_settings("tiny-r4-qv") == own and again.own_settings("tiny-r8-all") == ColumnOverrides()
    assert again.ticked() == ["base", "tiny-r8-all x0.5"]  # the strength column is listed again
    store["compare/column_settings"] = {"tiny-r4-qv": {"colour": "red"}}
    again.restore(store)
    assert again.overrides == {}  # settings it cannot read are dropped
