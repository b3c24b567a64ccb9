package org.cudabridge.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

import org.cudabridge.CudaBridge;
import org.cudabridge.executor.ExecutorCounters;

/** The executor gauges' names (after {@code executor.}): each is the statistics key it reads, as
 *  docs/glossary.md names it. Derived, not typed: the bridge's statistics names
 *  ({@link CudaBridge#statisticsNames()}, from the Python list the build put into cudabridge.jar),
 *  then the plugin's own counters ({@link ExecutorCounters#NAMES}). Known without Python, so
 *  every gauge is registered in {@code init} even when the service could not start. No Spark or
 *  Dropwizard class here: the Java harness prints the same names without either. */
public final class MetricNames {
    private MetricNames() {}

    public static final List<String> NAMES;

    static {
        List<String> names = new ArrayList<>(CudaBridge.statisticsNames());
        names.addAll(ExecutorCounters.NAMES);
        NAMES = Collections.unmodifiableList(names);
    }
}
