/* The destructor of an "arrow_array" capsule holding a PyMem-allocated ArrowArray struct:
 * it releases what the struct still holds (nothing if a consumer moved it out: its
 * release is then NULL) and frees the struct. Shared by sparkmq/_ipc.c,
 * sparkmq/_compose.c and sparkmq/_wire.c; include after Python.h and _arrow_c.h. */
#ifndef SPARKMQ_CAPSULE_H
#define SPARKMQ_CAPSULE_H

static void free_array_capsule(PyObject *capsule)
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

#endif
