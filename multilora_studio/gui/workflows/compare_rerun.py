"""A recorded Compare run sent again: each column on the base it ran on (an adapter: the base that
serves it now), with the prompts and settings it recorded."""

from __future__ import annotations

from multilora_studio.deploy import BasePool
from multilora_studio.gui.compare_bases import column_base
from multilora_studio.gui.workflows.compare_requests import ColumnRequest
from multilora_studio.run_records import ColumnRun, RunRecord


def rerun_base(pool: BasePool, record: RunRecord, column: ColumnRun) -> str | None:
    """The base a recorded column runs on again: a column without an adapter on the base it ran on
    when that is served (else as its name says), an adapter on its base now."""
    recorded = (column.base or record.engine).model_name
    if column.adapter is None and recorded in pool.names:
        return recorded
    return column_base(pool, column.name)


def rerun_requests(pool: BasePool, record: RunRecord) -> list[ColumnRequest]:
    """What each recorded column sends again (ValueError naming what the engine does not serve, or
    a recorded setting the engine refuses)."""
    bases = [rerun_base(pool, record, column) for column in record.columns]
    missing = [
        column.name
        for column, base in zip(record.columns, bases, strict=True)
        if base is None or (column.adapter is not None and column.adapter not in pool.adapters_of(base))
    ]
    if missing:
        raise ValueError(f"the engine does not serve {', '.join(missing)}.")
    return [
        ColumnRequest(column.name, column.prompt, column.settings.sampling_params(), str(base))
        for column, base in zip(record.columns, bases, strict=True)
    ]


def changed_bases(pool: BasePool, record: RunRecord, requests: list[ColumnRequest]) -> str | None:
    """A warning when a base a column ran on is served now with other weights (answers may differ)."""
    changed = {
        (ran.model_name, ran.model_digest, request.base)
        for column, request in zip(record.columns, requests, strict=True)
        for ran in [column.base or record.engine]
        if ran.model_digest != pool.base(request.base).digest
    }
    if not changed:
        return None
    return (
        "This run was recorded on "
        + "; ".join(
            f"{name} (sha256 {digest[:12]}), the engine serves {base} (sha256 {pool.base(base).digest[:12]})"
            for name, digest, base in sorted(changed)
        )
        + ": answers may differ."
    )
