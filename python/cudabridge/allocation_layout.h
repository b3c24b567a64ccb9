/*
 * allocation_layout.h: the C layout of an Allocation's slots (memory/allocation.py), shared by the
 * pool's fast path (memory/fastpath_slots.h, whose AllocationBase type it is) and the library
 * allocators' twin (allocators/_library_core.c, which reads the slots of the allocations its
 * library frees, to hand one out again).
 *
 * Invariants:
 *  - every field after the object header is a PyObject *, in this order, each exposed under the
 *    name allocation.py uses (ptr, size, id, stream, owner, _block, _arena, _pool, _extra, _state);
 *  - only an instance of the AllocationBase type (memory/_fastpath.c, which defines it) or of a
 *    subclass has this layout: a reader checks the type before it reads a field (an Allocation
 *    whose base is the Python fallback's __slots__ class has another).
 *
 * Built into each extension that includes it (setup.py and memory/native.py add this directory
 * to the include path and to the extension's inputs).
 */
#ifndef CB_ALLOCATION_LAYOUT_H
#define CB_ALLOCATION_LAYOUT_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *ptr, *size, *id, *stream, *owner, *block, *arena, *pool, *extra, *state;
} AllocationBase;

#endif /* CB_ALLOCATION_LAYOUT_H */
