package org.cudabridge;

/** Where a bound task's GPU work goes: its CUDA stream ({@code cudaStream_t} as a long) and the
 *  CUDA ordinal of its GPU. */
public record StreamBinding(long stream, int gpu) {}
