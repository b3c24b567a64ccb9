package org.cudabridge;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * Tables the build writes into the jar from their one definition in Python, so that Java never
 * keeps a copy of its own: {@code org/cudabridge/statistics.txt} ({@code BridgeControl.statistics_names()})
 * and {@code org/cudabridge/param_kinds.txt} (the kernel parameter kinds, {@code device/params.py}'s
 * {@code PARAM_KINDS}, in their code order) and {@code org/cudabridge/dtypes.txt} (the element types of
 * Python functions' arrays, {@code functions/dtypes.py}'s {@code DTYPES}, in code order), one entry a line.
 */
final class BuildTables {
    static final String STATISTICS = "statistics.txt";
    static final String PARAM_KINDS = "param_kinds.txt";
    static final String DTYPES = "dtypes.txt";

    private BuildTables() {}

    /** The non-blank lines of {@code org/cudabridge/<name>}, stripped; IllegalStateException when
     *  the jar lacks it (a jar not built by the project's build). */
    static List<String> lines(String name) {
        String path = "/org/cudabridge/" + name;
        List<String> out = new ArrayList<>();
        try (InputStream in = BuildTables.class.getResourceAsStream(path)) {
            if (in == null) {
                throw new IllegalStateException("cudabridge.jar has no org/cudabridge/" + name
                        + ": rebuild it (python -m cudabridge build)");
            }
            for (String line : new String(in.readAllBytes(), StandardCharsets.UTF_8).split("\n")) {
                if (!line.isBlank()) {
                    out.add(line.strip());
                }
            }
        } catch (IOException e) {
            throw new IllegalStateException("reading org/cudabridge/" + name + ": " + e, e);
        }
        return Collections.unmodifiableList(out);
    }
}
