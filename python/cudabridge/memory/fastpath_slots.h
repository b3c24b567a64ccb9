/*
 * fastpath_slots.h: the C layouts of the pool's three hot objects: AllocationBase (an
 * Allocation's fields, allocation.py), BlockBase (a Block's, block.py) and ArenaBase (a
 * StreamArena's, stream_arena.py), the base types their Python classes derive from, so that the
 * fast paths read and write their fields as C slots. Part of _fastpath.c's one translation unit:
 * included by it after <Python.h> and <structmember.h>, not a header to include anywhere else.
 *
 * Invariants:
 *  - every field after the object header is a PyObject * (a Block's and a StreamArena's are
 *    walked for GC through SLOT_COUNT / SLOT_ARRAY), each exposed under the name its class uses;
 *  - the Python subclasses add behaviour only; instances are of those subclasses, whose dealloc
 *    drops the type's reference;
 *  - a slot is replaced with set_slot (a new reference taken, the old one dropped).
 */

#ifndef CB_FASTPATH_SLOTS_H
#define CB_FASTPATH_SLOTS_H

/* ---- AllocationBase: the fields of an Allocation, as C slots ---------------------------- */

#include "allocation_layout.h"   /* typedef AllocationBase: the layout the library allocators' twin reads too */

static int alloc_traverse(AllocationBase *self, visitproc visit, void *arg) {
    Py_VISIT(self->ptr); Py_VISIT(self->size); Py_VISIT(self->id); Py_VISIT(self->stream);
    Py_VISIT(self->owner); Py_VISIT(self->block); Py_VISIT(self->arena); Py_VISIT(self->pool);
    Py_VISIT(self->extra); Py_VISIT(self->state);
    return 0;
}

static int alloc_clear(AllocationBase *self) {
    Py_CLEAR(self->ptr); Py_CLEAR(self->size); Py_CLEAR(self->id); Py_CLEAR(self->stream);
    Py_CLEAR(self->owner); Py_CLEAR(self->block); Py_CLEAR(self->arena); Py_CLEAR(self->pool);
    Py_CLEAR(self->extra); Py_CLEAR(self->state);
    return 0;
}

static void alloc_dealloc(AllocationBase *self) {
    /* Instances are of Python subclasses: their subtype_dealloc drops the type's reference. */
    PyObject_GC_UnTrack(self);
    alloc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define MEMBER(name, field) {name, T_OBJECT_EX, offsetof(AllocationBase, field), 0, NULL}
static PyMemberDef alloc_members[] = {
    MEMBER("ptr", ptr), MEMBER("size", size), MEMBER("id", id), MEMBER("stream", stream),
    MEMBER("owner", owner), MEMBER("_block", block), MEMBER("_arena", arena), MEMBER("_pool", pool),
    MEMBER("_extra", extra), MEMBER("_state", state),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AllocationBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.AllocationBase",
    .tp_basicsize = sizeof(AllocationBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of an Allocation (see allocation.py).",
    .tp_traverse = (traverseproc)alloc_traverse,
    .tp_clear = (inquiry)alloc_clear,
    .tp_dealloc = (destructor)alloc_dealloc,
    .tp_members = alloc_members,
    .tp_new = PyType_GenericNew,
};


/* ---- BlockBase and ArenaBase: the slots of Block and StreamArena -------------------------- */
/* The fast paths read and write these on every call; as C slots they cost a load, not an
 * attribute lookup. Python subclasses (block.py, stream_arena.py) add the behaviour. */

typedef struct {
    PyObject_HEAD
    PyObject *ptr, *size, *chunk, *prev, *next, *state, *epoch, *extra;
} BlockBase;

typedef struct {
    PyObject_HEAD
    PyObject *name, *handle, *kind, *eager, *bins, *recent, *epoch, *completed, *fences, *owner, *trim_at;
} ArenaBase;

/* Every field of these structs after the header is a PyObject *. */
#define SLOT_COUNT(T) ((Py_ssize_t)((sizeof(T) - sizeof(PyObject)) / sizeof(PyObject *)))
#define SLOT_ARRAY(o) ((PyObject **)((char *)(o) + sizeof(PyObject)))

#define DEFINE_SLOT_FUNCS(T, prefix)                                                    \
    static int prefix##_traverse(PyObject *self, visitproc visit, void *arg) {          \
        PyObject **f = SLOT_ARRAY(self);                                               \
        for (Py_ssize_t i = 0; i < SLOT_COUNT(T); i++)                                  \
            Py_VISIT(f[i]);                                                             \
        return 0;                                                                       \
    }                                                                                   \
    static int prefix##_clear(PyObject *self) {                                         \
        PyObject **f = SLOT_ARRAY(self);                                               \
        for (Py_ssize_t i = 0; i < SLOT_COUNT(T); i++)                                  \
            Py_CLEAR(f[i]);                                                             \
        return 0;                                                                       \
    }                                                                                   \
    static void prefix##_dealloc(PyObject *self) {                                      \
        PyObject_GC_UnTrack(self);                                                      \
        prefix##_clear(self);                                                           \
        Py_TYPE(self)->tp_free(self);                                                   \
    }

DEFINE_SLOT_FUNCS(BlockBase, block)
DEFINE_SLOT_FUNCS(ArenaBase, arena)

#define BMEMBER(name, field) {name, T_OBJECT_EX, offsetof(BlockBase, field), 0, NULL}
static PyMemberDef block_members[] = {
    BMEMBER("ptr", ptr), BMEMBER("size", size), BMEMBER("chunk", chunk), BMEMBER("prev", prev),
    BMEMBER("next", next), BMEMBER("state", state), BMEMBER("epoch", epoch), BMEMBER("extra", extra),
    {NULL, 0, 0, 0, NULL},
};
#define AMEMBER(name, field) {name, T_OBJECT_EX, offsetof(ArenaBase, field), 0, NULL}
static PyMemberDef arena_members[] = {
    AMEMBER("name", name), AMEMBER("handle", handle), AMEMBER("kind", kind), AMEMBER("eager", eager),
    AMEMBER("bins", bins), AMEMBER("recent", recent), AMEMBER("epoch", epoch),
    AMEMBER("completed", completed), AMEMBER("fences", fences), AMEMBER("_owner", owner),
    AMEMBER("trim_at", trim_at),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BlockBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.BlockBase",
    .tp_basicsize = sizeof(BlockBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of a Block (see block.py).",
    .tp_traverse = block_traverse,
    .tp_clear = block_clear,
    .tp_dealloc = block_dealloc,
    .tp_members = block_members,
    .tp_new = PyType_GenericNew,
};

static PyTypeObject ArenaBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.ArenaBase",
    .tp_basicsize = sizeof(ArenaBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of a StreamArena (see stream_arena.py).",
    .tp_traverse = arena_traverse,
    .tp_clear = arena_clear,
    .tp_dealloc = arena_dealloc,
    .tp_members = arena_members,
    .tp_new = PyType_GenericNew,
};

/* Replace a slot's value (a new reference is taken). */
static inline void set_slot(PyObject **slot, PyObject *value) {
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
}

#endif /* CB_FASTPATH_SLOTS_H */
