"""The rows of a commit's data files, as one Arrow table in the table's schema (`rows_of`).

A data file holds a row's non-partition columns; its partition columns are in the log (`DataFile.partition_
values`, strings in the Delta protocol's form) and are added back here, typed as the table's schema says. Files
are read whole into memory through delta-rs's own storage access (`deltalake.fs.DeltaStorageHandler`, the same
object_store and options as every other operation), then decoded by pyarrow: no pyarrow file system or thread
pool holds delta-rs's handler, and no deltalake call that lists files in Python (`DeltaTable.files`,
`to_pyarrow_table`) is made, since in deltalake 1.6 those leave the interpreter aborting at exit
(docs/delta.md, "Verified behaviour").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from weirflow_delta.log import DataFile


def partition_array(value: str | None, count: int, type_: pa.DataType) -> pa.Array:
    """``count`` copies of a partition value read from the log, as ``type_``. Timestamps are written in UTC
    without an offset (``2024-01-01 10:00:00.123456``), so they are parsed as such and then given the
    column's zone."""
    strings = pa.array([value] * count, pa.string())
    if pa.types.is_timestamp(type_) and type_.tz is not None:
        return strings.cast(pa.timestamp(type_.unit)).cast(type_)
    if pa.types.is_boolean(type_):
        return pa.array([None if value is None else value.lower() == "true"] * count, pa.bool_())
    return strings.cast(type_)


def file_rows(data: bytes, file: DataFile, schema: pa.Schema) -> pa.Table:
    """The rows of one data file (its bytes), with its partition columns, in ``schema``'s column order."""
    table = pq.read_table(pa.BufferReader(data))
    columns = []
    for column in schema:
        if column.name in file.partition_values:
            columns.append(partition_array(file.partition_values[column.name], table.num_rows, column.type))
        elif column.name in table.column_names:
            columns.append(table.column(column.name).cast(column.type))
        else:  # a column added to the table after this file was written
            columns.append(pa.nulls(table.num_rows, column.type))
    return pa.Table.from_arrays(columns, schema=schema)


def files_rows(handler: Any, files: Sequence[DataFile], schema: pa.Schema) -> list[pa.Table]:
    """The rows of each of ``files``, in order, read through ``handler`` (a `DeltaStorageHandler` of the
    table)."""
    return [file_rows(handler.open_input_file(f.path).read(), f, schema) for f in files]


def concat(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()


def partition_label(file: DataFile) -> str:
    """The table partition a file belongs to, as its directory is named (``day=2026-11-20/page=%2Fa`` reads
    ``day=2026-11-20/page=/a`` here); empty for an unpartitioned table."""
    return "/".join(f"{k}={'' if v is None else v}" for k, v in file.partition_values.items())
