/* sparkmq._compose: a segment batch composed from a producer's columns and the store's
 * defaults, as an Arrow C data interface struct, without building it in pyarrow.
 *
 * compose(template, given, given_schema, segment_schema, slots, values) takes:
 *   template        an "arrow_array" capsule: a record batch in SEGMENT_SCHEMA holding
 *                   the store's defaults, each column either all null or none, of at
 *                   least n rows (log/built.py builds one and keeps it: its first n rows
 *                   are taken, each column cut to n rows in a struct of this module's);
 *   given           an "arrow_array" capsule: the producer's batch of n rows, exported;
 *   given_schema    an "arrow_schema" capsule: that batch's schema;
 *   segment_schema  an "arrow_schema" capsule: SEGMENT_SCHEMA;
 *   slots           a tuple, one int per segment column: i >= 0 takes the given batch's
 *                   column i, -1 the template's, -2 - k the values values[k];
 *   values          a tuple of buffers of n fixed-width values each (no nulls) for int32,
 *                   int64 and timestamp columns: the queue id, and the store times the
 *                   caller stamps in place later.
 * and returns (import_capsule, import_address, kept_capsule): two "arrow_array" capsules
 * holding the same composed record batch. The first is for RecordBatch._import_from_c
 * (which moves it out); the second stays for the C readers (the limit screen, the IPC
 * writer), which do not move it. Whatever the batch points into is held until both are
 * released: the given struct (moved out of its capsule, which is left released), the
 * template capsule and the values' buffers.
 *
 * Returns None, moving nothing, where the columns do not fit: a given column whose type
 * is not the segment column's (format strings compared down the children), an offset
 * other than 0, an unknown null count, a length other than n, a values buffer for a
 * column of another type or of another size than n of its values, a template column
 * shorter than n or with some nulls and not all, a given column with nulls where the
 * template's has none (values the builder fills: format.fill_required, the born time).
 * The caller then builds the batch in pyarrow (log/batch.py's build_segment_batch): the
 * same batch, as the tests hold them.
 *
 * view(kept, first, k, slots, values) -> (import_capsule, import_address) | None reads
 * rows first..first+k-1 of a batch compose() made (kept: its kept capsule) with columns
 * inserted, without pyarrow: a read's message table of a batch the CommitLog's cache still
 * holds composed (log/reader.py). slots: one int per output column, i >= 0 the kept batch's
 * column i (the same buffers, its offset moved by first), -1 - j the values[j]; values: a
 * tuple of tuples of buffers, each one column of k values without nulls: (values,) of
 * 8-byte values, or (int32 offsets, data) of strings. The view holds the kept capsule and
 * the buffers until pyarrow releases it. None where they do not fit (a range past the
 * batch, a buffer of another size than k values, offsets not from 0 to the data's size).
 *
 * values(runs, kinds) -> tuple | None reads runs of rows of such batches (runs: a tuple of
 * (kept, first, k), at most 1,024) as Python values, one list per column, the runs' rows
 * one after the other (None for a column all null in every run's batch), as pyarrow's
 * to_pylist gives them but timestamps as int64 (ms): what the RocketMQ pop of batches the
 * cache still holds composed makes StoredMessages of (log/reader.py), without importing
 * the batches and converting sixteen columns in pyarrow. kinds: one letter per column (s
 * string, b binary, l list<string>, m map<string, string>, c int8, i int32, t int64).
 * None where a run's batch is not one compose() made, its range is past the batch, or a
 * column's buffers or children do not fit its kind.
 *
 * Why: building the 16-column batch in pyarrow and exporting it for the screen and the
 * writer cost a put ~16 us in a hot loop (timeit); composing it costs ~5 us, of which
 * this call ~1 (bench/README.md, "fifteenth session").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_arrow_c.h"
#include "_capsule.h"

#define MAX_COLUMNS 64
#define MAX_VALUES 4
#define MAX_DEPTH 16

typedef struct {
    int refs;                                   /* parents not yet released */
    struct ArrowArray given;                    /* moved from the caller's capsule */
    PyObject *template;                         /* the template's capsule, held */
    Py_buffer views[MAX_VALUES];                /* the values' buffers, held */
    int n_views;
    struct ArrowArray own[MAX_VALUES];          /* the value columns */
    const void *own_buffers[MAX_VALUES][2];
    struct ArrowArray cut[MAX_COLUMNS];         /* the template's columns, n rows of them */
    struct ArrowArray *children[MAX_COLUMNS];
} Shared;

static void free_shared(Shared *sh)
{
    if (sh->given.release)
        sh->given.release(&sh->given);
    release_held(sh->views, sh->n_views, sh->template, sh);
}

static void release_parent(struct ArrowArray *a)
{
    Shared *sh = a->private_data;
    a->release = NULL;
    if (__atomic_sub_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free_shared(sh);
}

static int same_type(const struct ArrowSchema *a, const struct ArrowSchema *b, int depth)
{
    if (depth > MAX_DEPTH || !a || !b || !a->format || !b->format || a->dictionary
            || b->dictionary || strcmp(a->format, b->format) != 0
            || a->n_children != b->n_children)
        return 0;
    for (int64_t i = 0; i < a->n_children; i++)
        if (!same_type(a->children[i], b->children[i], depth + 1))
            return 0;
    return 1;
}

/* The byte width of a value of an int32, int64 or timestamp column; 0 for other types. */
static int value_width(const char *f)
{
    if (f[0] == 'i' && !f[1])
        return 4;
    return (f[0] == 'l' && !f[1]) || (f[0] == 't' && f[1] == 's' && f[2] && f[3] == ':')
        ? 8 : 0;
}

/* A capsule holding a new parent struct over sh (one of sh's references). */
static PyObject *parent_capsule(Shared *sh, int64_t n, int64_t n_children,
                                struct ArrowArray **out)
{
    return struct_capsule(n, n_children, sh->children, release_parent, sh, out);
}

static PyObject *compose(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *template_capsule, *given_capsule, *given_sc, *segment_sc, *slots, *values;
    PyObject *first = NULL, *second = NULL;
    struct ArrowArray *t, *g, *a1, *a2;
    struct ArrowSchema *gs, *ss;
    Py_ssize_t n_slots, n_values;
    Shared *sh;
    int64_t n;
    (void)self;
    if (nargs != 6 || !PyTuple_Check(args[4]) || !PyTuple_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "compose takes 6 arguments: template, given, "
                        "given_schema, segment_schema (capsules), slots, values (tuples)");
        return NULL;
    }
    template_capsule = args[0], given_capsule = args[1], given_sc = args[2];
    segment_sc = args[3], slots = args[4], values = args[5];
    if (!(t = PyCapsule_GetPointer(template_capsule, "arrow_array"))
            || !(g = PyCapsule_GetPointer(given_capsule, "arrow_array"))
            || !(gs = PyCapsule_GetPointer(given_sc, "arrow_schema"))
            || !(ss = PyCapsule_GetPointer(segment_sc, "arrow_schema")))
        return NULL;
    n = g->length;
    n_slots = PyTuple_GET_SIZE(slots);
    n_values = PyTuple_GET_SIZE(values);
    if (!t->release || !g->release || n_slots > MAX_COLUMNS || n_values > MAX_VALUES
            || t->n_children != n_slots || ss->n_children != n_slots || t->length < n
            || t->offset != 0 || g->offset != 0 || gs->n_children != g->n_children)
        Py_RETURN_NONE;
    /* not calloc: zeroing the whole struct (its MAX_COLUMNS columns, ~6 KB) cost more
       than the rest of the call. What free_shared and the error paths read is zeroed
       here; every other field is written before it is read (children[i] and cut[i] for
       each slot, views[k] and own[k] for each value) */
    sh = PyMem_RawMalloc(sizeof(Shared));
    if (!sh)
        return PyErr_NoMemory();
    sh->refs = 0;
    sh->given.release = NULL;
    sh->template = NULL;
    sh->n_views = 0;
    for (Py_ssize_t k = 0; k < n_values; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(values, k), &sh->views[k], PyBUF_SIMPLE) < 0)
            goto fail;
        sh->n_views++;
        sh->own_buffers[k][0] = NULL;
        sh->own_buffers[k][1] = sh->views[k].buf;
        sh->own[k] = (struct ArrowArray){.length = n, .n_buffers = 2,
                                         .buffers = sh->own_buffers[k],
                                         .release = release_child};
    }
    for (Py_ssize_t i = 0; i < n_slots; i++) {
        long slot = PyLong_AsLong(PyTuple_GET_ITEM(slots, i));
        if (slot == -1 && PyErr_Occurred())
            goto fail;
        if (slot >= 0) {
            struct ArrowArray *c;
            if (slot >= g->n_children || !same_type(gs->children[slot], ss->children[i], 0))
                goto unfit;
            c = g->children[slot];
            if (!c->release || c->length != n || c->offset != 0 || c->null_count < 0
                    || (c->null_count > 0 && t->children[i]->null_count == 0))
                goto unfit;
            sh->children[i] = c;
        } else if (slot == -1) {
            /* the first n rows of a constant column: the same buffers (their first
               values are a shorter column's), the length and null count cut */
            const struct ArrowArray *c = t->children[i];
            if (!c->release || c->offset != 0 || c->length < n
                    || (c->null_count != 0 && c->null_count != c->length))
                goto unfit;
            sh->cut[i] = *c;
            sh->cut[i].length = n;
            sh->cut[i].null_count = c->null_count ? n : 0;
            sh->cut[i].release = release_child;
            sh->cut[i].private_data = NULL;
            sh->children[i] = &sh->cut[i];
        } else {
            long k = -2 - slot;
            if (k >= n_values || sh->views[k].len != value_width(ss->children[i]->format) * n
                    || sh->views[k].len == 0)
                goto unfit;
            sh->children[i] = &sh->own[k];
        }
    }
    sh->refs = 2;
    first = parent_capsule(sh, n, n_slots, &a1);
    if (first)
        second = parent_capsule(sh, n, n_slots, &a2);
    if (!second) {
        if (first) {          /* (not released: sh is freed below, with nothing moved) */
            a1->release = NULL;
            Py_DECREF(first);
        }
        goto fail;
    }
    /* what the batch points into: the given struct moved here (its children stay where
       they are: the moved struct still owns them), the template held */
    sh->given = *g;
    g->release = NULL;
    Py_INCREF(template_capsule);
    sh->template = template_capsule;
    return stolen_tuple(3, (PyObject *[]){first,
        PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)a1), second});
unfit:
    for (int k = 0; k < sh->n_views; k++)
        PyBuffer_Release(&sh->views[k]);
    PyMem_RawFree(sh);
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < sh->n_views; k++)
        PyBuffer_Release(&sh->views[k]);
    PyMem_RawFree(sh);
    return NULL;
}

PyDoc_STRVAR(compose_doc,
"compose(template, given, given_schema, segment_schema, slots, values)\n"
"    -> (import_capsule, import_address, kept_capsule) | None\n\n"
"A record batch in the segment schema whose columns are the given batch's, the\n"
"template's and the values' as slots says, as two capsules of one Arrow C struct; None\n"
"(nothing moved) where they do not fit. See sparkmq/_compose.c.");

typedef struct {
    PyObject *kept;                             /* the composed batch's kept capsule */
    Py_buffer views[2 * MAX_VALUES];            /* the values' buffers, held */
    int n_views;
    struct ArrowArray own[MAX_VALUES];          /* the value columns */
    const void *own_buffers[MAX_VALUES][3];
    struct ArrowArray cut[MAX_COLUMNS];         /* the kept batch's columns, k rows of them */
    struct ArrowArray *children[MAX_COLUMNS];
} View;

static void free_view(View *v)
{
    release_held(v->views, v->n_views, v->kept, v);
}

static void release_view(struct ArrowArray *a)
{
    View *v = a->private_data;
    a->release = NULL;
    free_view(v);
}

/* values[j] as column own[j] of k rows: 0 where it does not fit (sizes checked). */
static int own_column(View *v, PyObject *bufs, int j, int64_t k)
{
    Py_ssize_t nb;
    if (!PyTuple_Check(bufs) || (nb = PyTuple_GET_SIZE(bufs)) < 1 || nb > 2)
        return 0;
    for (Py_ssize_t b = 0; b < nb; b++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(bufs, b), &v->views[v->n_views],
                               PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            return 0;
        }
        v->own_buffers[j][1 + b] = v->views[v->n_views++].buf;
    }
    if (nb == 1) {
        if (v->views[v->n_views - 1].len != 8 * k)
            return 0;
    } else {
        const Py_buffer *off = &v->views[v->n_views - 2], *data = &v->views[v->n_views - 1];
        const int32_t *o = off->buf;
        if (off->len != 4 * (k + 1) || o[0] != 0 || o[k] != data->len)
            return 0;
        for (int64_t i = 0; i < k; i++)
            if (o[i + 1] < o[i])
                return 0;
    }
    v->own_buffers[j][0] = NULL;
    v->own[j] = (struct ArrowArray){.length = k, .n_buffers = 1 + nb,
                                    .buffers = v->own_buffers[j], .release = release_child};
    return 1;
}

static PyObject *view(PyObject *self, PyObject *args)
{
    PyObject *kept, *slots, *values, *capsule;
    long long first, k;
    struct ArrowArray *src, *a = NULL;
    Py_ssize_t n_slots, n_values;
    View *v;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLLO!O!", &kept, &first, &k, &PyTuple_Type, &slots,
                          &PyTuple_Type, &values))
        return NULL;
    if (!(src = PyCapsule_GetPointer(kept, "arrow_array")))
        return NULL;
    n_slots = PyTuple_GET_SIZE(slots);
    n_values = PyTuple_GET_SIZE(values);
    if (!src->release || src->release != release_parent || first < 0 || k < 1
            || first + k > src->length || src->offset != 0 || n_slots > MAX_COLUMNS
            || n_values > MAX_VALUES)
        Py_RETURN_NONE;
    v = PyMem_RawCalloc(1, sizeof(View));
    if (!v)
        return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < n_values; j++)
        if (!own_column(v, PyTuple_GET_ITEM(values, j), (int)j, k))
            goto unfit;
    for (Py_ssize_t i = 0; i < n_slots; i++) {
        long slot = PyLong_AsLong(PyTuple_GET_ITEM(slots, i));
        if (slot == -1 && PyErr_Occurred())
            goto fail;
        if (slot >= 0) {
            const struct ArrowArray *c;
            if (slot >= src->n_children)
                goto unfit;
            c = src->children[slot];
            if (!c->release || c->length != src->length)
                goto unfit;
            v->cut[i] = *c;
            v->cut[i].offset = c->offset + first;
            v->cut[i].length = k;
            v->cut[i].null_count = c->null_count == 0 ? 0
                : c->null_count == c->length ? k : -1;
            v->cut[i].release = release_child;
            v->cut[i].private_data = NULL;
            v->children[i] = &v->cut[i];
        } else {
            long j = -1 - slot;
            if (j >= n_values)
                goto unfit;
            v->children[i] = &v->own[j];
        }
    }
    if (!(capsule = struct_capsule(k, n_slots, v->children, release_view, v, &a)))
        goto fail;
    Py_INCREF(kept);
    v->kept = kept;
    return capsule_and_address(capsule, a);
fail:
    for (int i = 0; i < v->n_views; i++)
        PyBuffer_Release(&v->views[i]);
    PyMem_RawFree(v);
    return NULL;
unfit:
    for (int i = 0; i < v->n_views; i++)
        PyBuffer_Release(&v->views[i]);
    PyMem_RawFree(v);
    Py_RETURN_NONE;
}

/* values(): row i (of the array's logical rows) null? */
static int is_null(const struct ArrowArray *c, int64_t i)
{
    const uint8_t *bits = c->buffers[0];
    int64_t j = c->offset + i;
    return bits && c->null_count != 0 && !((bits[j >> 3] >> (j & 7)) & 1);
}

/* value i of a string (binary: bytes) array; NULL with an exception set on failure */
static PyObject *string_at(const struct ArrowArray *c, int64_t i, int binary)
{
    const int32_t *o = c->buffers[1];
    const char *d = c->buffers[2];
    int64_t j = c->offset + i;
    if (is_null(c, i))
        Py_RETURN_NONE;
    if (o[j + 1] < o[j]) {
        PyErr_SetString(PyExc_ValueError, "string offsets go back");
        return NULL;
    }
    return binary ? PyBytes_FromStringAndSize(d + o[j], o[j + 1] - o[j])
                  : PyUnicode_DecodeUTF8(d + o[j], o[j + 1] - o[j], NULL);
}

static int is_strings(const struct ArrowArray *c)
{
    return c->n_buffers == 3 && c->n_children == 0 && c->buffers[1] && c->buffers[2];
}

/* row i of a list<string> (map: list of (key, value) tuples) array, as pyarrow's
   to_pylist gives it */
static PyObject *nested_at(const struct ArrowArray *c, int64_t i, int map)
{
    const int32_t *o = c->buffers[1];
    const struct ArrowArray *e = c->children[0];
    int64_t j = c->offset + i;
    PyObject *out;
    if (is_null(c, i))
        Py_RETURN_NONE;
    if (o[j + 1] < o[j]) {
        PyErr_SetString(PyExc_ValueError, "list offsets go back");
        return NULL;
    }
    if (!(out = PyList_New(o[j + 1] - o[j])))
        return NULL;
    for (int32_t x = o[j]; x < o[j + 1]; x++) {
        PyObject *item;
        if (!map)
            item = string_at(e, x, 0);
        else {
            PyObject *k = string_at(e->children[0], e->offset + x, 0), *v;
            v = k ? string_at(e->children[1], e->offset + x, 0) : NULL;
            item = v ? PyTuple_Pack(2, k, v) : NULL;
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, x - o[j], item);
    }
    return out;
}

/* whether column c fits kind: s string, b binary, l list<string>, m map<string, string>,
   c int8, i int32, t int64 (a timestamp's) */
static int fits(const struct ArrowArray *c, char kind)
{
    const struct ArrowArray *e;
    switch (kind) {
    case 's': case 'b':
        return is_strings(c);
    case 'c': case 'i': case 't':
        return c->n_buffers == 2 && c->n_children == 0 && c->buffers[1];
    case 'l':
        return c->n_buffers == 2 && c->n_children == 1 && c->buffers[1]
            && is_strings(c->children[0]);
    case 'm':
        e = c->n_children == 1 ? c->children[0] : NULL;
        return c->n_buffers == 2 && c->buffers[1] && e && e->n_children == 2
            && is_strings(e->children[0]) && is_strings(e->children[1]);
    }
    return 0;
}

static PyObject *value_at(const struct ArrowArray *c, int64_t i, char kind)
{
    int64_t j = c->offset + i;
    switch (kind) {
    case 's': case 'b':
        return string_at(c, i, kind == 'b');
    case 'l': case 'm':
        return nested_at(c, i, kind == 'm');
    }
    if (is_null(c, i))
        Py_RETURN_NONE;
    if (kind == 'c')
        return PyLong_FromLong(((const int8_t *)c->buffers[1])[j]);
    if (kind == 'i')
        return PyLong_FromLong(((const int32_t *)c->buffers[1])[j]);
    return PyLong_FromLongLong(((const int64_t *)c->buffers[1])[j]);
}

#define MAX_RUNS 1024

/* a run's batch: the struct of a kept capsule compose() made, with rows first..first+k-1
   in it and its columns fitting kinds; NULL where not (no exception) */
static const struct ArrowArray *run_batch(PyObject *run, const char *kinds, Py_ssize_t n_kinds,
                                          long long *first, long long *k)
{
    PyObject *kept;
    const struct ArrowArray *src;
    if (!PyTuple_Check(run) || !PyArg_ParseTuple(run, "OLL", &kept, first, k)
            || !(src = PyCapsule_GetPointer(kept, "arrow_array"))) {
        PyErr_Clear();
        return NULL;
    }
    if (!src->release || src->release != release_parent || *first < 0 || *k < 1
            || *first + *k > src->length || src->offset != 0 || n_kinds != src->n_children)
        return NULL;
    for (Py_ssize_t i = 0; i < n_kinds; i++) {
        const struct ArrowArray *c = src->children[i];
        if (!c->release || c->length != src->length || !fits(c, kinds[i]))
            return NULL;
    }
    return src;
}

static PyObject *values(PyObject *self, PyObject *args)
{
    PyObject *runs, *out;
    const char *kinds;
    Py_ssize_t n_kinds, n_runs, total = 0;
    const struct ArrowArray *src[MAX_RUNS];
    long long first[MAX_RUNS], k[MAX_RUNS];
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y#", &PyTuple_Type, &runs, &kinds, &n_kinds))
        return NULL;
    n_runs = PyTuple_GET_SIZE(runs);
    if (n_runs < 1 || n_runs > MAX_RUNS)
        Py_RETURN_NONE;
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        if (!(src[r] = run_batch(PyTuple_GET_ITEM(runs, r), kinds, n_kinds, &first[r], &k[r])))
            Py_RETURN_NONE;
        total += k[r];
    }
    if (!(out = PyTuple_New(n_kinds)))
        return NULL;
    for (Py_ssize_t i = 0; i < n_kinds; i++) {
        PyObject *col;
        Py_ssize_t at = 0, all_null = 1;
        for (Py_ssize_t r = 0; r < n_runs && all_null; r++) {
            const struct ArrowArray *c = src[r]->children[i];
            all_null = c->null_count == c->length && c->buffers[0];
        }
        if (all_null) {                  /* (a column all null in every batch: None) */
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(out, i, Py_None);
            continue;
        }
        if (!(col = PyList_New(total)))
            goto fail;
        PyTuple_SET_ITEM(out, i, col);
        for (Py_ssize_t r = 0; r < n_runs; r++)
            for (int64_t x = 0; x < k[r]; x++) {
                PyObject *v = value_at(src[r]->children[i], first[r] + x, kinds[i]);
                if (!v)
                    goto fail;
                PyList_SET_ITEM(col, at++, v);
            }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(values_doc,
"values(runs, kinds) -> tuple | None\n\n"
"Runs (kept, first, k) of rows of composed batches (their kept capsules) as Python\n"
"values, one list per column (None: a column all null), as pyarrow's to_pylist gives\n"
"them, timestamps as int64; kinds: one letter per column. None where they do not fit.\n"
"See sparkmq/_compose.c.");

PyDoc_STRVAR(view_doc,
"view(kept, first, k, slots, values) -> (import_capsule, import_address) | None\n\n"
"Rows first..first+k-1 of a composed batch (its kept capsule) with value columns\n"
"inserted as slots says, as one Arrow C struct; None where they do not fit. See\n"
"sparkmq/_compose.c.");

static PyMethodDef methods[] = {
    {"compose", (PyCFunction)(void (*)(void))compose, METH_FASTCALL, compose_doc},
    {"view", view, METH_VARARGS, view_doc},
    {"values", values, METH_VARARGS, values_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sparkmq._compose",
    "A segment batch composed in C from a producer's columns and the store's defaults "
    "(sparkmq/_compose.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__compose(void)
{
    return PyModule_Create(&module);
}
