/*
 * cuhook._speedups: cuhook.lookup(int) in C (the stable ABI, Python 3.9+).
 *
 * A ctypes call costs a few hundred nanoseconds by itself; this one calls cuhook_lookup (of the
 * copy of libcuhook.so the package chose, by address) and builds the Allocation directly. It
 * holds the GIL throughout: the lookup is lock-free and never blocks, and the result lives on
 * the stack. Anything but an exact int goes to the Python implementation (`slow`), which also
 * raises the errors. Built by python/build_backend/cuhook_build.py when a C compiler and
 * Python's headers are there; without it the package uses ctypes alone.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* cuhook_mem_info_t (include/cuhook.h) */
typedef struct {
    void *address;
    size_t size;
    int mem_type;
    int device;
    unsigned int flags;
    const char *api;
    void *stream;
    void *pool;
    void *context;
    uint64_t seq;
} mem_info;

typedef int (*lookup_fn)(const void *address, size_t length, mem_info *info);

static lookup_fn c_lookup;
static PyObject *allocation_type; /* cuhook.Allocation, a tuple subclass */
static allocfunc allocation_alloc;
static PyObject *mem_types;       /* (MemType.HOST, .CUDA, .CUDA_MANAGED, .UNKNOWN) */
static PyObject *slow;            /* the Python lookup, for everything but an exact int */

/* API names are static strings of the library: a few dozen addresses, each decoded once. */
#define NAMES 256
static struct {
    const char *api;
    PyObject *name;
} names[NAMES];

static PyObject *api_name(const char *api) {
    if (api == NULL)
        api = "";
    size_t h = ((uintptr_t)api >> 3) % NAMES;
    for (size_t i = 0; i < NAMES; i++) {
        size_t k = (h + i) % NAMES;
        if (names[k].api == api) {
            Py_INCREF(names[k].name);
            return names[k].name;
        }
        if (names[k].api == NULL) {
            PyObject *name = PyUnicode_DecodeUTF8(api, (Py_ssize_t)strlen(api), "replace");
            if (name == NULL)
                return NULL;
            names[k].api = api;
            names[k].name = name;
            Py_INCREF(name);
            return name;
        }
    }
    return PyUnicode_DecodeUTF8(api, (Py_ssize_t)strlen(api), "replace");
}

static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address;
    PyObject *type, *types, *fallback;
    if (!PyArg_ParseTuple(args, "KOOO", &address, &type, &types, &fallback))
        return NULL;
    if (!PyType_Check(type) || !PyTuple_Check(types) || PyTuple_Size(types) != 4 ||
        !PyCallable_Check(fallback) || address == 0) {
        PyErr_SetString(PyExc_TypeError, "setup(address, Allocation, mem_types, slow)");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);
    if (alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "Allocation has no tp_alloc");
        return NULL;
    }
    Py_INCREF(type);
    Py_INCREF(types);
    Py_INCREF(fallback);
    Py_XDECREF(allocation_type);
    Py_XDECREF(mem_types);
    Py_XDECREF(slow);
    allocation_type = type;
    allocation_alloc = alloc;
    mem_types = types;
    slow = fallback;
    c_lookup = (lookup_fn)(uintptr_t)address;
    Py_RETURN_NONE;
}

static int put(PyObject *tuple, Py_ssize_t i, PyObject *value) {
    if (value == NULL)
        return -1;
    return PyTuple_SetItem(tuple, i, value); /* steals `value`, also on failure */
}

static PyObject *lookup(PyObject *self, PyObject *x) {
    (void)self;
    if (c_lookup == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cuhook._speedups.setup was not called");
        return NULL;
    }
    if (!PyLong_CheckExact(x))
        return PyObject_CallFunctionObjArgs(slow, x, NULL);
    unsigned long long address = PyLong_AsUnsignedLongLong(x);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or too large: the Python path raises the ValueError */
        return PyObject_CallFunctionObjArgs(slow, x, NULL);
    }
    mem_info info;
    if (c_lookup((const void *)(uintptr_t)address, 0, &info) != 0)
        Py_RETURN_NONE;
    PyObject *a = allocation_alloc((PyTypeObject *)allocation_type, 7);
    if (a == NULL)
        return NULL;
    PyObject *mem_type = PyTuple_GetItem(mem_types, info.mem_type & 3); /* borrowed */
    Py_XINCREF(mem_type);
    if (put(a, 0, PyLong_FromUnsignedLongLong((uintptr_t)info.address)) < 0 ||
        put(a, 1, PyLong_FromSize_t(info.size)) < 0 || put(a, 2, mem_type) < 0 ||
        put(a, 3, PyLong_FromLong(info.device)) < 0 || put(a, 4, api_name(info.api)) < 0 ||
        put(a, 5, PyLong_FromUnsignedLong(info.flags)) < 0 ||
        put(a, 6, PyLong_FromUnsignedLongLong(info.seq)) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(address, Allocation, mem_types, slow): the cuhook_lookup to call, what to build, "
     "and the Python lookup for everything but an exact int."},
    {"lookup", lookup, METH_O,
     "lookup(x) -> Allocation | None\n\n"
     "The allocation that contains x, from the registry alone (no driver call), or None. x is "
     "an int address, a ctypes.c_void_p, an object with data_ptr() (PyTorch), with "
     "__cuda_array_interface__ (CuPy, Numba), or a DLPack producer (JAX); anything else raises "
     "TypeError, an int outside 0..2**64-1 ValueError. (In C for an int; see docs/python.md.)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "cuhook.lookup(int) in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
