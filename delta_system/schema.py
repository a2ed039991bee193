"""Whether a commit's rows fit its table, said before anything is written (`fit_rows`, `check_new_table`).

A table's columns come from the rows of the commit that created it (docs/delta.md), and weirflow never
changes them: later rows must have the same columns, in types that convert to the table's without loss
(``int32`` into ``bigint``, ``large_string`` into ``string``). delta-rs would refuse most mismatches too,
but as "number of fields does not match: 3 vs 2" or a bare cast error; here the refusal names the table, each
column and both types, and says what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from weirflow_delta.errors import DeltaSchemaError

_EVOLVE = (
    "a Delta table keeps the columns of its first commit: write these rows to another stream, or change the "
    "table (ALTER TABLE, or deltalake's TableAlterer) and restart"
)


def _listed(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def fit_rows(rows: pa.Table, schema: pa.Schema, table: str, where: str) -> pa.Table:
    """``rows`` converted to ``schema`` (the table's, column order included), or `DeltaSchemaError` naming the
    table ``table`` at ``where`` and every column that does not fit."""
    have, want = set(rows.column_names), set(schema.names)
    problems = []
    extra = [n for n in rows.column_names if n not in want]
    missing = [n for n in schema.names if n not in have]
    if extra:
        problems.append(f"the table has no column {_listed(extra)}")
    if missing:
        problems.append(f"the rows lack column {_listed(missing)}")
    converted = []
    for column in schema:
        if column.name not in have:
            continue
        values = rows.column(column.name)
        try:
            converted.append(values.cast(column.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            first = str(exc).splitlines()[0]
            problems.append(
                f"column '{column.name}' is {values.type} in the rows, {column.type} in the table ({first})"
            )
    if problems:
        raise DeltaSchemaError(
            f"rows do not fit Delta table '{table}' at {where}: {'; '.join(problems)}; {_EVOLVE}"
        )
    return pa.Table.from_arrays(converted, schema=schema)


def check_new_table(
    rows: pa.Table, id_column: str, partition_by: Sequence[str], table: str, key: str | None
) -> None:
    """Rows that create a table must hold the id column and every configured partition column, and leave a
    column that is not a partition (Delta stores partition values only in the log)."""
    names = rows.column_names
    if id_column not in names:
        raise DeltaSchemaError(
            f"rows for Delta table '{table}' have no id column '{id_column}' (systems.<name>.record.id.field): "
            "every row carries its output id (docs/guarantees.md)"
        )
    absent = [c for c in partition_by if c not in names]
    if absent:
        raise DeltaSchemaError(
            f"Delta table '{table}' is to be partitioned by {_listed(list(partition_by))} ({key}), but the rows "
            f"have no column {_listed(absent)}; their columns are {_listed(names)}"
        )
    if partition_by and set(partition_by) >= set(names):
        raise DeltaSchemaError(
            f"Delta table '{table}' cannot be partitioned by every one of its columns ({key}): keep at least one "
            "out of the partitioning"
        )


def check_partitioning(
    existing: Sequence[str], wanted: Sequence[str], table: str, where: str, key: str | None
) -> None:
    """A table is partitioned at its creation and never again: configured columns other than the table's are
    refused, naming both (no configuration accepts the table's own)."""
    if key is not None and list(existing) != list(wanted):
        raise DeltaSchemaError(
            f"Delta table '{table}' at {where} is partitioned by {_listed(existing) or 'no column'}, but {key} "
            f"says {_listed(wanted)}: a table's partitioning is fixed when its first commit creates it; make "
            "the key agree with the table, or write to a new table"
        )
