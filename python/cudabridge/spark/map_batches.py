"""PySpark's front of ``org.cudabridge.spark.GpuPython.mapBatches``: a Python function over a
DataFrame's columns in batches, run inside each executor's own Python (the bridge's), on the
task's stream, with no Python worker::

    from cudabridge.spark import map_batches

    def transform(columns):                      # a dict: column name -> device array (one batch)
        x = columns["x"]
        return {"id": columns["id"], "y": x * 2.0 + 1.0}

    out = map_batches(df.filter("x > 0"), transform, "id BIGINT, y DOUBLE").groupBy().sum("y")

``function`` is a function (pickled here with PySpark's cloudpickle and loaded once per executor;
the executors must run this Python's version) or a reference ``"package.module:function"``
(imported on the executors from their Python path and the job's ``--py-files``). Arrays are CuPy
arrays on a GPU and numpy arrays on the emulated device: ``cudabridge.functions.array_module(x)``
gives the library of either. Columns are fixed-width and non-null (GpuPython's class comment);
the executors need the plugin (``spark.plugins=org.cudabridge.spark.CudaBridgePlugin``).
"""

from __future__ import annotations

from typing import Any, Callable, Union

from ..functions.function_table import pickle_function


def map_batches(df: Any, function: Union[str, Callable[[dict], dict]], schema: Any, *,
                batch_rows: int | None = None) -> Any:
    """``df``'s rows in batches through ``function``, as a DataFrame of ``schema`` (a
    ``StructType`` or a DDL string); ``batch_rows`` overrides ``spark.cudabridge.pythonBatchRows``."""
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType, _parse_datatype_string

    spark = df.sparkSession
    if isinstance(schema, str):
        schema = _parse_datatype_string(schema)
    if not isinstance(schema, StructType):
        raise TypeError(f"map_batches: schema is a StructType or a DDL string, got {type(schema).__name__}")
    jvm = spark._jvm
    options = jvm.java.util.HashMap()
    if batch_rows is not None:
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int):
            raise TypeError(f"map_batches: batch_rows is an int, got {type(batch_rows).__name__}")
        options.put("batchRows", str(batch_rows))
    gpu_python = jvm.org.cudabridge.spark.GpuPython
    if isinstance(function, str):
        jdf = gpu_python.mapBatches(df._jdf, function, schema.json(), options)
    elif callable(function):
        jdf = gpu_python.mapBatchesPickled(df._jdf, bytearray(pickle_function(function)), schema.json(), options)
    else:
        raise TypeError(f"map_batches: function is a callable or a 'package.module:function' reference, got "
                        f"{type(function).__name__}")
    return DataFrame(jdf, spark)
