"""The Spark side of cudabridge: the executor plugin's jar, the examples' jar, and what
``spark-submit`` needs to run them.

* ``jvm/src/spark/java/org/cudabridge/spark`` -> ``_native/cudabridge-spark.jar``: the plugin
  (``org.cudabridge.spark.CudaBridgePlugin``), compiled against the jars of the ``pyspark``
  package (needed at compile time only; a user of the core API without Spark never loads it);
* ``spark-examples/src/main/java`` -> ``spark-examples/build/cudabridge-examples.jar``: the
  example jobs and the Spark-free Java harness.

* :func:`map_batches`: PySpark's front of ``GpuPython.mapBatches`` (a Python function over column
  batches inside the executors' own Python).

``python -m cudabridge.spark build | classpath | examples-jar | submit-conf`` drives :mod:`.build`.
"""

from .build import classpath, examples_jar_path, plugin_jar_path, submit_conf
from .map_batches import map_batches

__all__ = ["classpath", "examples_jar_path", "map_batches", "plugin_jar_path", "submit_conf"]
