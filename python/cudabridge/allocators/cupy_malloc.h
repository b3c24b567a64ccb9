/*
 * cupy_malloc.h: the C twin of cupy.py's malloc (make_malloc) and of its allocations' owner
 * (_Release), so that CuPy's allocation and its free run no Python frame of ours: CuPy calls the
 * CupyMalloc object for each allocation, which allocates through allocate_common (the library
 * allocators' twin, this translation unit) and wraps the allocation in CuPy's UnownedMemory and
 * MemoryPointer with a CupyOwner as the memory's owner; CuPy drops the owner with the memory, and
 * the owner's deallocation queues the free (one deque append: safe in CuPy's __dealloc__, on any
 * thread, inside the pool's own calls).
 *
 * The Python malloc stays the reference: a call this twin does not take (size 0, a call the
 * allocation twin hands over, an argument that is not one int) goes to it as it stands, and
 * nothing was allocated before it does.
 *
 * Invariants (as the reference's):
 *  - an allocation handed to CuPy has exactly one owner, which queues its free once: when it is
 *    dropped, unless hand_over took the allocation (owner.allocation set to None) first;
 *  - an allocation whose wrapping fails is freed (queued) before the error reaches CuPy;
 *  - the GIL is held throughout; no lock is taken here.
 *
 * Part of _library_core.c's one translation unit (after LibraryCore, allocate_common and
 * queue_free); not a header to include anywhere else.
 */
#ifndef CB_CUPY_MALLOC_H
#define CB_CUPY_MALLOC_H

#include <structmember.h>

/* ---- CupyOwner: the owner of one allocation's UnownedMemory (cupy.py's _Release) ------------ */
typedef struct {
    PyObject_HEAD
    PyObject *allocator;    /* the LibraryAllocator (hand_over calls its hand_over) */
    PyObject *allocation;   /* the Allocation; None once handed over */
    LibraryCore *core;      /* whose queue its free goes to */
} CupyOwner;

static void owner_dealloc(CupyOwner *self) {
    if (self->allocation != NULL && self->allocation != Py_None) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        /* reported against the allocation: self is at refcount 0, and the hook would take and drop
         * a reference to it, deallocating it again */
        if (queue_free(self->core, self->allocation, Py_True) < 0) PyErr_WriteUnraisable(self->allocation);
        PyErr_Restore(et, ev, etb);
    }
    Py_XDECREF(self->allocator);
    Py_XDECREF(self->allocation);
    Py_XDECREF((PyObject *)self->core);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef owner_members[] = {
    {"allocator", T_OBJECT, offsetof(CupyOwner, allocator), READONLY, "the library's LibraryAllocator"},
    {"allocation", T_OBJECT, offsetof(CupyOwner, allocation), 0, "the Allocation; None once handed over"},
    {NULL, 0, 0, 0, NULL},
};

/* No GC: it refers to the allocator, an allocation and the core, none of which refers back to it. */
static PyTypeObject CupyOwnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.allocators._library_core.CupyOwner",
    .tp_basicsize = sizeof(CupyOwner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "the owner of one CuPy allocation's memory: dropped with it, it queues the free (cupy.py's _Release)",
    .tp_dealloc = (destructor)owner_dealloc,
    .tp_members = owner_members,
};

/* ---- CupyMalloc: the callable CuPy calls for each allocation --------------------------------- */
typedef struct {
    PyObject_HEAD
    LibraryCore *core;
    PyObject *allocator;        /* the LibraryAllocator */
    PyObject *unowned;          /* cupy.cuda.memory.UnownedMemory */
    PyObject *pointer;          /* cupy.cuda.memory.MemoryPointer */
    PyObject *get_device;       /* cupy.cuda.runtime.getDevice */
    PyObject *current_stream;   /* cupy.cuda.get_current_stream */
    PyObject *reference;        /* cupy.py's malloc: the calls not taken here */
    vectorcallfunc vectorcall;
} CupyMalloc;

static int malloc_traverse(CupyMalloc *self, visitproc visit, void *arg) {
    Py_VISIT((PyObject *)self->core); Py_VISIT(self->allocator); Py_VISIT(self->unowned); Py_VISIT(self->pointer);
    Py_VISIT(self->get_device); Py_VISIT(self->current_stream); Py_VISIT(self->reference);
    return 0;
}

static int malloc_clear(CupyMalloc *self) {
    Py_CLEAR(self->core); Py_CLEAR(self->allocator); Py_CLEAR(self->unowned); Py_CLEAR(self->pointer);
    Py_CLEAR(self->get_device); Py_CLEAR(self->current_stream); Py_CLEAR(self->reference);
    return 0;
}

static void malloc_dealloc(CupyMalloc *self) {
    PyObject_GC_UnTrack(self);
    malloc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* malloc(size) -> MemoryPointer. */
static PyObject *malloc_call(CupyMalloc *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int positive = kwnames == NULL && nargs == 1 && PyLong_CheckExact(args[0])
                   ? PyObject_RichCompareBool(args[0], zero, Py_GT) : 0;
    if (positive != 1) {   /* size 0 (CuPy's empty arrays), a bad size, not one int */
        PyErr_Clear();
        return PyObject_Vectorcall(self->reference, args, nargsf, kwnames);
    }
    PyObject *device = PyObject_CallNoArgs(self->get_device);
    if (device == NULL) return NULL;
    PyObject *stream = PyObject_CallNoArgs(self->current_stream);
    PyObject *sptr = stream == NULL ? NULL : PyObject_GetAttr(stream, name_ptr);
    Py_XDECREF(stream);
    if (sptr == NULL) {
        Py_DECREF(device);
        return NULL;
    }
    PyObject *a = NULL;
    int rc = allocate_common(self->core, args[0], device, sptr, 0, &a);
    Py_DECREF(sptr);
    if (rc != 0) {
        Py_DECREF(device);
        return rc == HAND_OVER ? PyObject_Vectorcall(self->reference, args, nargsf, kwnames) : NULL;
    }
    /* the task's allocation from here: every way out either hands it to its owner or queues its free */
    CupyOwner *owner = PyObject_New(CupyOwner, &CupyOwnerType);
    if (owner == NULL) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        if (queue_free(self->core, a, Py_True) < 0) PyErr_WriteUnraisable(self->reference);
        PyErr_Restore(et, ev, etb);
        Py_DECREF(a);
        Py_DECREF(device);
        return NULL;
    }
    owner->allocator = Py_NewRef(self->allocator);
    owner->allocation = a;   /* the reference allocate_common gave */
    owner->core = (LibraryCore *)Py_NewRef((PyObject *)self->core);
    PyObject *ptr, *size;
    if (self->core->allocation_base != Py_None && PyObject_TypeCheck(a, (PyTypeObject *)self->core->allocation_base)) {
        ptr = Py_XNewRef(((AllocationBase *)a)->ptr);   /* the slots in place (allocation_layout.h) */
        size = Py_XNewRef(((AllocationBase *)a)->size);
        if (ptr == NULL || size == NULL) {
            Py_CLEAR(size);
            PyErr_SetString(PyExc_SystemError, "cudabridge cupy malloc: an allocation without its pointer or size");
        }
    } else {
        ptr = PyObject_GetAttr(a, name_ptr);
        size = ptr == NULL ? NULL : PyObject_GetAttr(a, name_size);
    }
    PyObject *mem = NULL, *out = NULL;
    if (size != NULL) {
        PyObject *margs[4] = {ptr, size, (PyObject *)owner, device};
        mem = PyObject_Vectorcall(self->unowned, margs, 4, NULL);
    }
    if (mem != NULL) {
        PyObject *pargs[2] = {mem, zero};
        out = PyObject_Vectorcall(self->pointer, pargs, 2, NULL);
    }
    Py_XDECREF(mem);
    Py_XDECREF(size);
    Py_XDECREF(ptr);
    Py_DECREF(device);
    Py_DECREF(owner);   /* held by the memory now; dropped here on a failure, which queues the free */
    return out;
}

static PyTypeObject CupyMallocType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.allocators._library_core.CupyMalloc",
    .tp_basicsize = sizeof(CupyMalloc),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "malloc(size) -> MemoryPointer: CuPy's allocation from the task's pool (cupy.py's make_malloc)",
    .tp_traverse = (traverseproc)malloc_traverse,
    .tp_clear = (inquiry)malloc_clear,
    .tp_dealloc = (destructor)malloc_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CupyMalloc, vectorcall),
};

/* core.cupy_malloc(allocator, unowned, pointer, get_device, current_stream, reference) -> CupyMalloc */
static PyObject *core_cupy_malloc(LibraryCore *self, PyObject *args) {
    PyObject *allocator, *unowned, *pointer, *get_device, *current_stream, *reference;
    if (!PyArg_ParseTuple(args, "OOOOOO:cupy_malloc", &allocator, &unowned, &pointer, &get_device, &current_stream,
                          &reference))
        return NULL;
    CupyMalloc *m = PyObject_GC_New(CupyMalloc, &CupyMallocType);
    if (m == NULL) return NULL;
    m->core = (LibraryCore *)Py_NewRef((PyObject *)self);
    m->allocator = Py_NewRef(allocator);
    m->unowned = Py_NewRef(unowned);
    m->pointer = Py_NewRef(pointer);
    m->get_device = Py_NewRef(get_device);
    m->current_stream = Py_NewRef(current_stream);
    m->reference = Py_NewRef(reference);
    m->vectorcall = (vectorcallfunc)malloc_call;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

/* Ready the types and the names; 0, or -1 with an error. Called once, at the module's import. */
static int cupy_malloc_ready(PyObject *module) {
    if (PyType_Ready(&CupyOwnerType) < 0 || PyType_Ready(&CupyMallocType) < 0)
        return -1;
    Py_INCREF(&CupyOwnerType);
    if (PyModule_AddObject(module, "CupyOwner", (PyObject *)&CupyOwnerType) < 0) {
        Py_DECREF(&CupyOwnerType);
        return -1;
    }
    return 0;
}

#endif /* CB_CUPY_MALLOC_H */
