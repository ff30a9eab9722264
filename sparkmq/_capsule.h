/* What the modules that read and make Arrow C structs share (sparkmq/_ipc.c, _compose.c,
 * _wire.c and _screen.c; include after Python.h and _arrow_c.h): a record batch's two
 * structs out of the capsules it was exported to; the destructor of an
 * "arrow_array" capsule holding a PyMem-allocated ArrowArray struct, which releases what
 * the struct still holds (nothing if a consumer moved it out: its release is then NULL)
 * and frees the struct; a struct batch made in such a capsule; the release callbacks
 * of a struct's children and of what a struct held; and the small tuples their calls
 * return, made without Py_BuildValue. */
#ifndef SPARKMQ_CAPSULE_H
#define SPARKMQ_CAPSULE_H

/* The structs of a record batch exported to schema_capsule ("arrow_schema") and
 * array_capsule ("arrow_array"), as RecordBatch.__arrow_c_array__() exports one: 1 with
 * *s and *a set where they are a struct of as many columns at offset 0 with no null row;
 * 0 where they are not; -1 with an exception set where a capsule is not of its kind. */
static inline int exported_batch(PyObject *schema_capsule, PyObject *array_capsule,
                                 struct ArrowSchema **s, struct ArrowArray **a)
{
    if (!(*s = PyCapsule_GetPointer(schema_capsule, "arrow_schema"))
            || !(*a = PyCapsule_GetPointer(array_capsule, "arrow_array")))
        return -1;
    return (*s)->format && strcmp((*s)->format, "+s") == 0
        && (*a)->n_children == (*s)->n_children && (*a)->offset == 0
        && (*a)->null_count <= 0 && (*a)->length >= 0;
}

static inline void free_array_capsule(PyObject *capsule)
{
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (!a) {
        PyErr_Clear();
        return;
    }
    if (a->release)
        a->release(a);
    PyMem_Free(a);
}

/* A struct batch of n rows over children, released by release with private: in a new
   "arrow_array" capsule (NULL with an exception set; *out the struct). */
static inline PyObject *struct_capsule(int64_t n, int64_t n_children,
                                       struct ArrowArray **children,
                                       void (*release)(struct ArrowArray *), void *private,
                                       struct ArrowArray **out)
{
    static const void *no_buffers[1] = {NULL};     /* a struct array has no buffer of its own */
    struct ArrowArray *a = PyMem_Calloc(1, sizeof(struct ArrowArray));
    PyObject *capsule;
    if (!a)
        return PyErr_NoMemory();
    a->length = n;
    a->n_buffers = 1;
    a->buffers = no_buffers;
    a->n_children = n_children;
    a->children = children;
    a->release = release;
    a->private_data = private;
    capsule = PyCapsule_New(a, "arrow_array", free_array_capsule);
    if (!capsule) {
        PyMem_Free(a);
        return NULL;
    }
    *out = a;
    return capsule;
}

/* A child of a struct is released with its parent (the C data interface: a consumer
   releases the base struct only); this marks a moved child released. */
static inline void release_child(struct ArrowArray *a)
{
    a->release = NULL;
}

/* Let go of the buffers and the object a struct held, then of its memory: under the GIL,
   which pyarrow may not hold where it releases the struct (a Flight thread). At exit the
   objects go with the interpreter. */
static inline void release_held(Py_buffer *views, int n, PyObject *obj, void *mem)
{
    if (Py_IsInitialized()) {
        PyGILState_STATE gil = PyGILState_Ensure();
        for (int i = 0; i < n; i++)
            PyBuffer_Release(&views[i]);
        Py_XDECREF(obj);
        PyGILState_Release(gil);
    }
    PyMem_RawFree(mem);
}

/* A tuple of the n objects in items, each reference stolen (Py_BuildValue's "N", without
   reading a format: ~1 k instructions less a call): NULL with an exception set where an
   item is NULL (its maker failed) or the tuple cannot be made, every item released. */
static inline PyObject *stolen_tuple(Py_ssize_t n, PyObject *const *items)
{
    PyObject *t = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!items[i])
            goto fail;
    if (!(t = PyTuple_New(n)))
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, items[i]);
    return t;
fail:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(items[i]);
    return NULL;
}

/* A capsule and the address of the struct it holds, as a tuple (capsule stolen). */
static inline PyObject *capsule_and_address(PyObject *capsule, const void *address)
{
    return stolen_tuple(2, (PyObject *[]){capsule,
        PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)address)});
}

#endif
