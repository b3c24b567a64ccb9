package org.cudabridge;

/** Python thread states: in the interpreter now, created by the bridge, and deleted by it (a
 *  Java thread that called into Python keeps one until it ends). */
public record ThreadStates(long inInterpreter, long created, long deleted) {}
