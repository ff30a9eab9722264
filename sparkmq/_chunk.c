/* sparkmq._chunk: the ConsumeQueue's Chunk (sparkmq/log/consumequeue.py) as a small C type
 * that CPython's cyclic garbage collector does not track.
 *
 * Chunk(start, batch_offset, rows, sizes, tags_codes, store_ts): the entries one appended
 * batch gave one queue. start and batch_offset are ints (int64); the other four are the
 * entries' numpy arrays, held as they are given. Its attributes are read-only, and `end`
 * is start + len(rows).
 *
 * Why C: the in-memory ConsumeQueue keeps one chunk per send and queue, up to
 * memoryConsumeQueueBytes (~84,000 of one-message sends by default), and a Python object
 * that holds references is tracked by the collector. A full pass of the collector visits
 * every tracked object with the GIL held: over a broker that had taken 80,000 one-message
 * sends it took 167-193 ms (bench/bench_gc.py; bench/README.md, "GC and the
 * ConsumeQueue's chunks"). A chunk holds ints and numeric arrays only, so it can be no
 * part of a reference cycle, and a type without Py_TPFLAGS_HAVE_GC is never visited. It
 * is also made by one vectorcall, not a dataclass's Python __init__.
 *
 * The caller vouches that the four arrays hold no reference back to a chunk (numeric
 * numpy arrays, as Dispatcher.dispatch makes them): a cycle through an untracked object
 * would never be collected.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    long long start;
    long long batch_offset;
    PyObject *rows;
    PyObject *sizes;
    PyObject *tags_codes;
    PyObject *store_ts;
} Chunk;

static PyTypeObject ChunkType;

static PyObject *make(PyTypeObject *type, PyObject *const *args)
{
    long long start = PyLong_AsLongLong(args[0]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    long long batch_offset = PyLong_AsLongLong(args[1]);
    if (batch_offset == -1 && PyErr_Occurred())
        return NULL;
    Chunk *self = (Chunk *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->start = start;
    self->batch_offset = batch_offset;
    self->rows = Py_NewRef(args[2]);
    self->sizes = Py_NewRef(args[3]);
    self->tags_codes = Py_NewRef(args[4]);
    self->store_ts = Py_NewRef(args[5]);
    return (PyObject *)self;
}

static const char *FIELDS[] = {"start", "batch_offset", "rows", "sizes", "tags_codes",
                               "store_ts"};

static PyObject *chunk_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *a[6];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO:Chunk", (char **)FIELDS,
                                     &a[0], &a[1], &a[2], &a[3], &a[4], &a[5]))
        return NULL;
    return make(type, a);
}

/* Chunk(...) with six positional arguments (the send path's call), without a tuple */
static PyObject *chunk_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && n == 6)
        return make((PyTypeObject *)type, args);
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    PyObject *kwargs = NULL;
    if (kwnames != NULL) {
        kwargs = PyDict_New();
        for (Py_ssize_t i = 0; kwargs != NULL && i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0)
                Py_CLEAR(kwargs);
        if (kwargs == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
    }
    PyObject *out = chunk_new((PyTypeObject *)type, tuple, kwargs);
    Py_DECREF(tuple);
    Py_XDECREF(kwargs);
    return out;
}

static void chunk_dealloc(Chunk *self)
{
    Py_XDECREF(self->rows);
    Py_XDECREF(self->sizes);
    Py_XDECREF(self->tags_codes);
    Py_XDECREF(self->store_ts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *chunk_end(Chunk *self, void *closure)
{
    (void)closure;
    Py_ssize_t n = PyObject_Length(self->rows);
    if (n < 0)
        return NULL;
    return PyLong_FromLongLong(self->start + n);
}

static PyObject *chunk_repr(Chunk *self)
{
    return PyUnicode_FromFormat("Chunk(start=%lld, batch_offset=%lld, rows=%R)",
                                self->start, self->batch_offset, self->rows);
}

static PyMemberDef members[] = {
    {"start", T_LONGLONG, offsetof(Chunk, start), READONLY,
     "queue offset of the first entry"},
    {"batch_offset", T_LONGLONG, offsetof(Chunk, batch_offset), READONLY,
     "physical offset of the batch"},
    {"rows", T_OBJECT, offsetof(Chunk, rows), READONLY, "each entry's row (int32)"},
    {"sizes", T_OBJECT, offsetof(Chunk, sizes), READONLY, "each entry's body bytes (int32)"},
    {"tags_codes", T_OBJECT, offsetof(Chunk, tags_codes), READONLY,
     "each entry's tags code (int64)"},
    {"store_ts", T_OBJECT, offsetof(Chunk, store_ts), READONLY,
     "each entry's store time (int64 ms)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef getset[] = {
    {"end", (getter)chunk_end, NULL, "queue offset after the last entry", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ChunkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sparkmq._chunk.Chunk",
    .tp_basicsize = sizeof(Chunk),
    .tp_dealloc = (destructor)chunk_dealloc,
    .tp_repr = (reprfunc)chunk_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,        /* no Py_TPFLAGS_HAVE_GC: see the top */
    .tp_doc = "Chunk(start, batch_offset, rows, sizes, tags_codes, store_ts): the entries "
              "one appended batch gave one queue (read-only; untracked by the collector).",
    .tp_members = members,
    .tp_getset = getset,
    .tp_new = chunk_new,
    .tp_vectorcall = chunk_vectorcall,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sparkmq._chunk",
    "The ConsumeQueue's Chunk as a C type the cyclic collector does not track.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__chunk(void)
{
    if (PyType_Ready(&ChunkType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Chunk", (PyObject *)&ChunkType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
