package org.cudabridge;

/**
 * A kernel launch's shape: {@code LaunchConfig.grid(gx, gy, gz).block(bx, by, bz).sharedMemory(bytes)}.
 * Dimensions are positive (the device's limits are checked at the launch); 1 where left out.
 */
public record LaunchConfig(int gridX, int gridY, int gridZ, int blockX, int blockY, int blockZ, long sharedBytes) {
    public LaunchConfig {
        for (int d : new int[] {gridX, gridY, gridZ, blockX, blockY, blockZ}) {
            if (d < 1) {
                throw new IllegalArgumentException("LaunchConfig: dimensions must be positive, got grid (" + gridX + ", "
                        + gridY + ", " + gridZ + "), block (" + blockX + ", " + blockY + ", " + blockZ + ")");
            }
        }
        if (sharedBytes < 0) {
            throw new IllegalArgumentException("LaunchConfig: shared memory must not be negative, got " + sharedBytes);
        }
    }

    public static LaunchConfig grid(int x) {
        return new LaunchConfig(x, 1, 1, 1, 1, 1, 0);
    }

    public static LaunchConfig grid(int x, int y, int z) {
        return new LaunchConfig(x, y, z, 1, 1, 1, 0);
    }

    public LaunchConfig block(int x) {
        return new LaunchConfig(gridX, gridY, gridZ, x, 1, 1, sharedBytes);
    }

    public LaunchConfig block(int x, int y, int z) {
        return new LaunchConfig(gridX, gridY, gridZ, x, y, z, sharedBytes);
    }

    public LaunchConfig sharedMemory(long bytes) {
        return new LaunchConfig(gridX, gridY, gridZ, blockX, blockY, blockZ, bytes);
    }

    int[] dims() {
        return new int[] {gridX, gridY, gridZ, blockX, blockY, blockZ};
    }
}
