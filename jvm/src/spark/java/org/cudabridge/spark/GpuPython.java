package org.cudabridge.spark;

import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Objects;

import org.apache.spark.SparkFiles;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.cudabridge.DType;
import org.cudabridge.SettingsTable;
import org.cudabridge.executor.PluginConf;

/**
 * A Python function over a DataFrame's columns in batches, run inside the executor's own Python
 * (the bridge's), on the task's stream, with no Python worker:
 * <pre>{@code
 * Dataset<Row> out = GpuPython.mapBatches(df.filter("x > 0"), "mypkg.udfs:transform",
 *         StructType.fromDDL("id BIGINT, y DOUBLE"));
 * }</pre>
 * Per partition, batches of {@code batchRows} rows (the option, else {@code spark.cudabridge.pythonBatchRows})
 * of the input's columns go to the device through the bridge's pinned staging; the function gets a
 * dict of column name to device array (CuPy on a GPU, numpy on the emulated device) on the task's
 * stream and returns a dict with the output schema's columns, one-dimensional, of their types, all
 * of one length (any number of rows: fewer for a filter, one for a per-batch reduction); those come
 * back as the output rows. Spark's plan around it is untouched: filter before, aggregate after.
 *
 * <p>Columns are fixed-width and non-null: boolean, tinyint, smallint, int, bigint, float, double.
 * Strings, decimals, dates, nested types and nulls are out of scope and refused when the plan is
 * made (a null met at run time fails the task with the column and row named).
 *
 * <p>The function is a reference, {@code "package.module:function"}, imported once per executor
 * from its Python path and the job's {@code --py-files} (the files Spark fetched into the
 * executor's {@link SparkFiles} folder), or, from PySpark, a function pickled on the driver
 * ({@code cudabridge.spark.map_batches}). Executors need the plugin ({@code spark.plugins}).
 */
public final class GpuPython {
    /** The per-call option naming the rows per batch. */
    public static final String BATCH_ROWS = "batchRows";

    private GpuPython() {}

    public static Dataset<Row> mapBatches(Dataset<Row> df, String reference, StructType outputSchema) {
        return mapBatches(df, reference, outputSchema, Collections.emptyMap());
    }

    public static Dataset<Row> mapBatches(Dataset<Row> df, String reference, StructType outputSchema,
                                          Map<String, String> options) {
        Objects.requireNonNull(reference, "mapBatches: reference");
        return plan(df, reference, null, outputSchema, options);
    }

    /** For PySpark (through the gateway): the output schema as Spark's JSON ({@code StructType.json()}). */
    public static Dataset<Row> mapBatches(Dataset<Row> df, String reference, String outputSchemaJson,
                                          Map<String, String> options) {
        return mapBatches(df, reference, schema(outputSchemaJson), options);
    }

    /** For PySpark: a function pickled by {@code cudabridge.functions.pickle_function} on the driver. */
    public static Dataset<Row> mapBatchesPickled(Dataset<Row> df, byte[] pickled, String outputSchemaJson,
                                                 Map<String, String> options) {
        Objects.requireNonNull(pickled, "mapBatches: pickled");
        return plan(df, null, pickled.clone(), schema(outputSchemaJson), options);
    }

    private static StructType schema(String json) {
        Objects.requireNonNull(json, "mapBatches: outputSchema");
        DataType t = DataType.fromJson(json);
        if (!(t instanceof StructType s)) {
            throw new IllegalArgumentException("mapBatches: the output schema is a struct, got " + t.simpleString());
        }
        return s;
    }

    private static Dataset<Row> plan(Dataset<Row> df, String reference, byte[] pickled, StructType out,
                                     Map<String, String> options) {
        Objects.requireNonNull(df, "mapBatches: df");
        Objects.requireNonNull(out, "mapBatches: outputSchema");
        Objects.requireNonNull(options, "mapBatches: options");
        for (String key : options.keySet()) {
            if (!key.equals(BATCH_ROWS)) {
                throw new IllegalArgumentException("mapBatches: unknown option " + key + " (known: " + BATCH_ROWS + ")");
            }
        }
        String rows = options.getOrDefault(BATCH_ROWS,
                df.sparkSession().conf().get(PluginConf.PYTHON_BATCH_ROWS, null));
        int batchRows = (int) SettingsTable.PYTHON_BATCH_ROWS.intValue(rows);   // checked: a bad value is refused, named
        StructType in = df.schema();
        List<DType> inTypes = types("input", in);
        List<DType> outTypes = types("output", out);
        BatchPartition fn = new BatchPartition(reference, pickled, names(in), inTypes, names(out), outTypes, batchRows);
        return df.mapPartitions(fn, Encoders.row(out));
    }

    private static List<String> names(StructType s) {
        List<String> names = new ArrayList<>();
        for (StructField f : s.fields()) {
            names.add(f.name());
        }
        return names;
    }

    /** Each column's element type; a type that is not fixed-width is refused, naming the column. */
    static List<DType> types(String side, StructType s) {
        List<DType> out = new ArrayList<>();
        for (StructField f : s.fields()) {
            DType t = dtype(f.dataType());
            if (t == null) {
                throw new IllegalArgumentException("mapBatches: " + side + " column " + f.name() + " is "
                        + f.dataType().simpleString() + "; batches hold fixed-width columns only (boolean, tinyint, "
                        + "smallint, int, bigint, float, double): select or cast the columns first");
            }
            out.add(t);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException("mapBatches: the " + side + " has no columns");
        }
        return out;
    }

    static DType dtype(DataType t) {
        if (t.equals(DataTypes.BooleanType)) return DType.BOOL;
        if (t.equals(DataTypes.ByteType)) return DType.INT8;
        if (t.equals(DataTypes.ShortType)) return DType.INT16;
        if (t.equals(DataTypes.IntegerType)) return DType.INT32;
        if (t.equals(DataTypes.LongType)) return DType.INT64;
        if (t.equals(DataTypes.FloatType)) return DType.FLOAT32;
        if (t.equals(DataTypes.DoubleType)) return DType.FLOAT64;
        return null;
    }

    /** The folders and files Python imports the job's modules from on an executor: the SparkFiles
     *  folder (where {@code --py-files} land) and each zip, egg or wheel in it. */
    static List<String> searchPaths() {
        String root = SparkFiles.getRootDirectory();
        List<String> paths = new ArrayList<>();
        if (root == null || root.isEmpty()) {
            return paths;
        }
        paths.add(root);
        File[] files = new File(root).listFiles();
        if (files != null) {
            for (File f : files) {
                String n = f.getName();
                if (f.isFile() && (n.endsWith(".zip") || n.endsWith(".egg") || n.endsWith(".whl"))) {
                    paths.add(f.getAbsolutePath());
                }
            }
        }
        Collections.sort(paths.subList(1, paths.size()));
        return paths;
    }

    /** The per-partition work (serialized into each task). */
    static final class BatchPartition implements MapPartitionsFunction<Row, Row> {
        private static final long serialVersionUID = 1L;
        private final String reference;
        private final byte[] pickled;
        private final List<String> inNames;
        private final List<DType> inTypes;
        private final List<String> outNames;
        private final List<DType> outTypes;
        private final int batchRows;

        BatchPartition(String reference, byte[] pickled, List<String> inNames, List<DType> inTypes, List<String> outNames,
                       List<DType> outTypes, int batchRows) {
            this.reference = reference;
            this.pickled = pickled;
            this.inNames = List.copyOf(inNames);
            this.inTypes = List.copyOf(inTypes);
            this.outNames = List.copyOf(outNames);
            this.outTypes = List.copyOf(outTypes);
            this.batchRows = batchRows;
        }

        @Override
        public java.util.Iterator<Row> call(java.util.Iterator<Row> rows) {
            if (!rows.hasNext()) {
                return Collections.emptyIterator();
            }
            return new ColumnBatches(rows, reference, pickled, inNames, inTypes, outNames, outTypes, batchRows);
        }
    }
}
