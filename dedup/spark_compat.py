"""A fix for pyspark 4.0.0's ``applyInPandasWithState`` under recent pyarrow (measured: 26.0.1).

Only for pyspark 4.0.x: 4.2.0 (pinned now) rewrote that serializer and passes the dedup's tests
without it, so ``apply`` does nothing there. Kept for installs that still run 4.0.x.

pyspark 4.0.0 reads each group's data range from a struct column whose rows after the last group
are null. Recent pyarrow turns the int32 fields of such a struct into floats when converting it
to pandas, and ``RecordBatch.slice(0.0, 58.0)`` then fails with "'float' object cannot be
interpreted as an integer": every micro-batch with data fails. The patch converts the two fields
back to ``int`` after pyspark's own conversion; nothing else changes. It is applied when
``dedup.job`` is imported, which happens in every Python worker before it reads data (the
stateful function lives in that module).
"""

from __future__ import annotations

from typing import Any

_FIELDS = ("startOffset", "numRows")
_applied = False


def apply() -> None:
    """Patch ``ApplyInPandasWithStateSerializer.arrow_to_pandas`` once per process."""
    global _applied  # noqa: PLW0603  one process-wide patch
    if _applied:
        return
    import pyspark  # noqa: PLC0415  only where pyspark is loaded

    if not pyspark.__version__.startswith("4.0."):
        _applied = True
        return
    from pyspark.sql.pandas import serializers  # noqa: PLC0415  only where pyspark is loaded

    cls: Any = serializers.ApplyInPandasWithStateSerializer  # 4.0.x's shape, untyped in 4.2
    original: Any = cls.arrow_to_pandas

    def arrow_to_pandas(self: Any, arrow_column: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, arrow_column, *args, **kwargs)
        names = getattr(arrow_column.type, "names", None)
        if names is not None and "startOffset" in names:
            for row in result:
                if isinstance(row, dict):
                    for name in _FIELDS:
                        if row.get(name) is not None:
                            row[name] = int(row[name])
        return result

    cls.arrow_to_pandas = arrow_to_pandas
    _applied = True
