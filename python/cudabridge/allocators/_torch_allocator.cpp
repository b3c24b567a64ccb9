/*
 * _torch_allocator.cpp: the functions PyTorch's CUDAPluggableAllocator loads by name from this
 * library (torch.py passes its path), over the torch plug-in's LibraryAllocator
 * (library_allocator.py). Built with the package's C extensions (setup.py, memory/native.py's
 * ALLOCATOR_PARTS), so it is the installed package's own file, as trusted as its Python; a Python
 * extension module too, so that torch.py can hand it the Python callables (connect()).
 *
 *   void *cb_torch_alloc(size_t size, int device, cudaStream_t stream)
 *   void  cb_torch_free(void *ptr, size_t size, int device, cudaStream_t stream)
 *   void  cb_torch_record_stream(void *ptr, cudaStream_t stream)   set_record_stream_fn
 *   void  cb_torch_reset(void)                                      set_reset_fn (empty_cache)
 *
 * Why C++: an allocation that fails must fail in torch, not return NULL (torch stores whatever
 * alloc returns as the tensor's data without a check, and a kernel would then write through
 * address 0). A C++ exception thrown here crosses torch's std::function into its own handlers,
 * which raise it in Python as RuntimeError with this message, as RMM's allocator does.
 *
 * Invariants:
 *  - torch calls these with or without the GIL, from any thread (autograd's included): each call
 *    takes it with PyGILState_Ensure and gives it back before returning or throwing;
 *  - free never throws (torch calls it from destructors): a failure there is written with
 *    PyErr_WriteUnraisable and the memory stays with the pool (reclaimed at its task's release,
 *    or at close);
 *  - the callables are set once, before torch is told of this library, and never cleared while
 *    the process lives (torch may free a tensor during interpreter shutdown).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <stdexcept>
#include <string>

static PyObject *g_alloc, *g_free, *g_record, *g_reset;   // strong references, set by connect()

namespace {

// The pending Python error as one line ("Type: message"), cleared. GIL held.
std::string take_error() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    std::string out = "unknown error";
    if (type != nullptr) {
        PyObject *name = PyObject_GetAttrString(type, "__name__");
        PyObject *text = value != nullptr ? PyObject_Str(value) : nullptr;
        const char *n = name != nullptr ? PyUnicode_AsUTF8(name) : nullptr;
        const char *t = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
        out = std::string(n != nullptr ? n : "?") + ": " + (t != nullptr ? t : "?");
        PyErr_Clear();
        Py_XDECREF(name);
        Py_XDECREF(text);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return out;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void *cb_torch_alloc(size_t size, int device, void *stream) {
    if (size == 0) return nullptr;   // as torch's own allocator: no memory, no call
    PyGILState_STATE st = PyGILState_Ensure();
    if (g_alloc == nullptr) {
        PyGILState_Release(st);
        throw std::runtime_error("cudabridge torch allocator: not connected to a service (cudabridge.allocators.torch.install)");
    }
    PyObject *r = PyObject_CallFunction(g_alloc, "nin", (Py_ssize_t)size, device, (Py_ssize_t)(uintptr_t)stream);
    void *ptr = nullptr;
    std::string why;
    if (r != nullptr) {
        ptr = PyLong_AsVoidPtr(r);
        Py_DECREF(r);
        if (PyErr_Occurred()) why = take_error();
    } else {
        why = take_error();
    }
    PyGILState_Release(st);
    if (!why.empty()) throw std::runtime_error("cudabridge torch allocator: " + why);
    return ptr;
}

__attribute__((visibility("default"))) void cb_torch_free(void *ptr, size_t size, int device, void *stream) {
    (void)size;
    (void)device;
    (void)stream;   // the allocation knows its stream, and any recorded since
    if (ptr == nullptr || g_free == nullptr) return;
    PyGILState_STATE st = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(g_free, "n", (Py_ssize_t)(uintptr_t)ptr);
    if (r == nullptr) PyErr_WriteUnraisable(g_free);
    Py_XDECREF(r);
    PyGILState_Release(st);
}

__attribute__((visibility("default"))) void cb_torch_record_stream(void *ptr, void *stream) {
    if (ptr == nullptr || g_record == nullptr) return;
    PyGILState_STATE st = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(g_record, "nn", (Py_ssize_t)(uintptr_t)ptr, (Py_ssize_t)(uintptr_t)stream);
    std::string why;
    if (r == nullptr) why = take_error();
    Py_XDECREF(r);
    PyGILState_Release(st);
    if (!why.empty()) throw std::runtime_error("cudabridge torch allocator: record_stream: " + why);
}

__attribute__((visibility("default"))) void cb_torch_reset(void) {
    if (g_reset == nullptr) return;
    PyGILState_STATE st = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs(g_reset);
    if (r == nullptr) PyErr_WriteUnraisable(g_reset);
    Py_XDECREF(r);
    PyGILState_Release(st);
}

}  // extern "C"

// connect(alloc, free, record_stream, reset): the Python side of the four functions, once.
static PyObject *connect(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *f, *rs, *rt;
    if (!PyArg_ParseTuple(args, "OOOO:connect", &a, &f, &rs, &rt)) return nullptr;
    if (!PyCallable_Check(a) || !PyCallable_Check(f) || !PyCallable_Check(rs) || !PyCallable_Check(rt)) {
        PyErr_SetString(PyExc_TypeError, "connect: four callables");
        return nullptr;
    }
    if (g_alloc != nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "connect: connected already (torch keeps one allocator per process)");
        return nullptr;
    }
    Py_INCREF(a);
    Py_INCREF(f);
    Py_INCREF(rs);
    Py_INCREF(rt);
    g_free = f;
    g_record = rs;
    g_reset = rt;
    g_alloc = a;   // last: a call that sees it sees the others
    Py_RETURN_NONE;
}

// addresses(): the four functions' addresses, for torch's set_*_fn hooks and the tests.
static PyObject *addresses(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "alloc", (Py_ssize_t)(uintptr_t)&cb_torch_alloc, "free",
                         (Py_ssize_t)(uintptr_t)&cb_torch_free, "record_stream",
                         (Py_ssize_t)(uintptr_t)&cb_torch_record_stream, "reset", (Py_ssize_t)(uintptr_t)&cb_torch_reset);
}

static PyMethodDef methods[] = {
    {"connect", connect, METH_VARARGS, "connect(alloc, free, record_stream, reset): the Python side, once"},
    {"addresses", addresses, METH_NOARGS, "addresses() -> dict: the C functions' addresses"},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_allocator",
                                    "PyTorch's pluggable allocator functions over cudabridge's pools", -1, methods,
                                    nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC PyInit__torch_allocator(void) { return PyModule_Create(&module); }
