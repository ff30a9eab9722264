/* sparkmq._screen: the input-limit screen of sparkmq/log/limits.py over a batch in
 * SEGMENT_SCHEMA, in one C call.
 *
 * screen(schema_capsule, array_capsule, limits, reserved) takes a record batch as the Arrow
 * C data interface exports it (RecordBatch.__arrow_c_array__()) and returns the list of the
 * rows that may break an input rule: a superset of the rows limits.message_violation
 * refuses. The caller decides each listed row by that rule (the one home of the rules and
 * of their messages); a row not listed breaks none. limits: (maxMessageSize,
 * maxUserPropertySize, userPropertyMaxNum, maxMessageGroupSize, maxMessageIdSize);
 * reserved: a tuple of bytes, the property keys refused as the system's.
 *
 * A row is listed when, among its present values:
 *   - its size (body, topic, tag, keys, property keys and values, message group, message
 *     id, born host, transaction id: bytes) is over maxMessageSize;
 *   - it has more than userPropertyMaxNum properties, or its tag, keys and properties add
 *     up to more than maxUserPropertySize bytes;
 *   - a tag, key, property key or value, message group or message id holds a control
 *     character (a byte under 0x20, 0x7F, or U+0080..U+009F: 0xC2 0x80..0x9F), or a tag
 *     holds '|';
 *   - a tag, key, message group or message id may be blank (its first byte is ASCII
 *     whitespace or not ASCII: the rule strips Unicode whitespace);
 *   - a key or a property value is null, or a property key is a reserved one;
 *   - its message group is maxMessageGroupSize bytes or longer, its message id longer than
 *     maxMessageIdSize;
 *   - its born or delivery timestamp is outside 0..253402300799999 ms, or its message type
 *     outside 0..3 (or null).
 *
 * The caller vouches that the batch is valid Arrow in full (limits.check_valid_arrow runs
 * first wherever data comes from outside): the C data interface carries no buffer sizes,
 * so offsets are trusted as they are.
 *
 * Returns None, reading nothing, for a batch whose columns are not the segment schema's
 * (the caller then screens with numpy). Why C: the numpy screen is ~60 calls, ~50-120 us
 * a batch whatever its size, and a batch of under 4 rows skipped it for the rule itself
 * (~17 us a row); this is one call of a few us for the usual batch.
 *
 * body_sizes(offsets, first, n) measures a send's bodies for the checks before it: each
 * value's bytes and their least, greatest and sum (the body refusal's two bounds and the
 * bytes counted), one call where numpy took four.
 *
 * send_shape(schema_capsule, array_capsule, formats) reads a Flight send batch before its
 * checks (sparkmq/broker/batchsend.py, send_shape): its column names, each column's
 * format against the send column's (formats: name -> format), null counts, the one
 * topic of every row, the bodies' sizes as body_sizes gives them, and whether a tags or
 * message_group value is empty: what typed(), the topics' distinct values, the null
 * counts and the body measure took ~10 pyarrow calls for. None for a batch with a column
 * of another format, or nested: the caller reads that one in pyarrow. The batch must be
 * valid Arrow in full (the caller validates it first).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_arrow_c.h"
#include "_capsule.h"

#define MAX_TIMESTAMP_MS 253402300799999LL
#define MAX_MESSAGE_TYPE 3
#define MAX_RESERVED 64

/* A string or binary array (int32 offsets): logical value i is at physical at + i. */
typedef struct {
    const uint8_t *valid;           /* NULL: every value present */
    const int32_t *off;
    const uint8_t *data;
    int64_t at;
} Str;

/* A list or map array: row r's values are children off[at + r] .. off[at + r + 1]. */
typedef struct {
    const uint8_t *valid;
    const int32_t *off;
    int64_t at;
} List;

/* A fixed-width array of 8 (timestamps) or 1 (int8) byte values. */
typedef struct {
    const uint8_t *valid;
    const void *values;
    int64_t at;
} Fixed;

typedef struct {
    Str topic, body, tags, group, id, host, txid, key_item, prop_key, prop_value;
    List keys, props;
    Fixed born, delivery, type;
} Columns;

static int present(const uint8_t *valid, int64_t i)
{
    return !valid || ((valid[i >> 3] >> (i & 7)) & 1);
}

static const uint8_t *validity(const struct ArrowArray *a)
{
    return (a->null_count == 0 || a->n_buffers < 1) ? NULL : (const uint8_t *)a->buffers[0];
}

/* Reads array a (type s, its values from physical index a->offset + base) as a string or
 * binary array; 0 when it is not one. */
static int str_of(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t base,
                  Str *out)
{
    const char *f = s->format;
    if (!f || !(f[0] == 'u' || f[0] == 'z') || f[1] || a->n_buffers != 3 || a->dictionary
            || !a->buffers[1])
        return 0;
    out->valid = validity(a);
    out->off = (const int32_t *)a->buffers[1];
    out->data = (const uint8_t *)a->buffers[2];
    out->at = a->offset + base;
    return 1;
}

static int list_of(const struct ArrowSchema *s, const struct ArrowArray *a, char kind,
                   List *out)
{
    const char *f = s->format;
    if (!f || f[0] != '+' || f[1] != kind || f[2] || a->n_buffers != 2 || a->n_children != 1
            || s->n_children != 1 || !a->buffers[1])
        return 0;
    out->valid = validity(a);
    out->off = (const int32_t *)a->buffers[1];
    out->at = a->offset;
    return 1;
}

static int fixed_of(const struct ArrowSchema *s, const struct ArrowArray *a, int width,
                    Fixed *out)
{
    const char *f = s->format;
    int ok = width == 8 ? (f && strncmp(f, "tsm:", 4) == 0) : (f && f[0] == 'c' && !f[1]);
    if (!ok || a->n_buffers != 2 || !a->buffers[1])
        return 0;
    out->valid = validity(a);
    out->values = a->buffers[1];
    out->at = a->offset;
    return 1;
}

static int index_of(const struct ArrowSchema *s, const char *name)
{
    for (int64_t i = 0; i < s->n_children; i++)
        if (s->children[i]->name && strcmp(s->children[i]->name, name) == 0)
            return (int)i;
    return -1;
}

/* The batch's columns, or 0 when one is missing or of another type. */
static int columns_of(const struct ArrowSchema *s, const struct ArrowArray *a, Columns *c)
{
    static const char *text[] = {"topic", "body", "tags", "message_group", "unique_key",
                                 "born_host", "transaction_id"};
    Str *slots[] = {&c->topic, &c->body, &c->tags, &c->group, &c->id, &c->host, &c->txid};
    int i;
    for (int k = 0; k < 7; k++) {
        if ((i = index_of(s, text[k])) < 0 || !str_of(s->children[i], a->children[i], 0,
                                                      slots[k]))
            return 0;
    }
    if ((i = index_of(s, "keys")) < 0 || !list_of(s->children[i], a->children[i], 'l', &c->keys)
            || !str_of(s->children[i]->children[0], a->children[i]->children[0], 0,
                       &c->key_item))
        return 0;
    if ((i = index_of(s, "properties")) < 0
            || !list_of(s->children[i], a->children[i], 'm', &c->props))
        return 0;
    {
        const struct ArrowSchema *es = s->children[i]->children[0];
        const struct ArrowArray *ea = a->children[i]->children[0];
        if (!es->format || strcmp(es->format, "+s") != 0 || ea->n_children != 2
                || es->n_children != 2
                || !str_of(es->children[0], ea->children[0], ea->offset, &c->prop_key)
                || !str_of(es->children[1], ea->children[1], ea->offset, &c->prop_value))
            return 0;
    }
    if ((i = index_of(s, "born_timestamp")) < 0
            || !fixed_of(s->children[i], a->children[i], 8, &c->born))
        return 0;
    if ((i = index_of(s, "delivery_timestamp")) < 0
            || !fixed_of(s->children[i], a->children[i], 8, &c->delivery))
        return 0;
    if ((i = index_of(s, "message_type")) < 0
            || !fixed_of(s->children[i], a->children[i], 1, &c->type))
        return 0;
    return 1;
}

/* Value i of str: its bytes and length; 0 when it is null. */
static int value(const Str *str, int64_t i, const uint8_t **p, int64_t *len)
{
    int64_t at = str->at + i;
    if (!present(str->valid, at))
        return 0;
    *p = str->data ? str->data + str->off[at] : NULL;
    *len = (int64_t)str->off[at + 1] - str->off[at];
    return 1;
}

/* May text p[0..n) break a text rule: a control character, '|' (bar), blank (blank)? */
static int text_bad(const uint8_t *p, int64_t n, int bar, int blank)
{
    if (blank && n > 0) {
        uint8_t b = p[0];
        if (b == ' ' || (b >= 0x09 && b <= 0x0D) || (b >= 0x1C && b <= 0x1F) || b >= 0x80)
            return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (b < 0x20 || b == 0x7F || (bar && b == '|'))
            return 1;
        if (b == 0xC2 && (i + 1 == n || p[i + 1] <= 0x9F))
            return 1;
    }
    return 0;
}

typedef struct {
    long long max_size, max_prop_size, max_prop_num, max_group, max_id;
    const char *reserved[MAX_RESERVED];
    Py_ssize_t reserved_len[MAX_RESERVED];
    int n_reserved;
} Limits;

static int reserved_key(const Limits *lim, const uint8_t *p, int64_t n)
{
    for (int k = 0; k < lim->n_reserved; k++)
        if (lim->reserved_len[k] == n && memcmp(lim->reserved[k], p, (size_t)n) == 0)
            return 1;
    return 0;
}

static int time_bad(const Fixed *f, int64_t r)
{
    int64_t at = f->at + r, ms;
    if (!present(f->valid, at))
        return 0;
    ms = ((const int64_t *)f->values)[at];
    return ms < 0 || ms > MAX_TIMESTAMP_MS;
}

/* May row r break a rule? */
static int row_bad(const Columns *c, const Limits *lim, int64_t r)
{
    const uint8_t *p;
    int64_t n, size = 0, prop_bytes = 0;
    if (value(&c->body, r, &p, &n))
        size += n;
    if (value(&c->topic, r, &p, &n))
        size += n;
    if (value(&c->tags, r, &p, &n)) {
        size += n, prop_bytes += n;
        if (text_bad(p, n, 1, 1))
            return 1;
    }
    if (present(c->keys.valid, c->keys.at + r)) {
        int64_t at = c->keys.at + r;
        for (int64_t j = c->keys.off[at]; j < c->keys.off[at + 1]; j++) {
            if (!value(&c->key_item, j, &p, &n) || text_bad(p, n, 0, 1))
                return 1;                               /* a null key, or a bad one */
            size += n, prop_bytes += n;
        }
    }
    if (present(c->props.valid, c->props.at + r)) {
        int64_t at = c->props.at + r, lo = c->props.off[at], hi = c->props.off[at + 1];
        if (hi - lo > lim->max_prop_num)
            return 1;
        for (int64_t j = lo; j < hi; j++) {
            if (!value(&c->prop_key, j, &p, &n) || text_bad(p, n, 0, 0)
                    || reserved_key(lim, p, n))
                return 1;
            size += n, prop_bytes += n;
            if (!value(&c->prop_value, j, &p, &n) || text_bad(p, n, 0, 0))
                return 1;                               /* a null value, or a bad one */
            size += n, prop_bytes += n;
        }
    }
    if (value(&c->group, r, &p, &n)) {
        if (n >= lim->max_group || text_bad(p, n, 0, 1))
            return 1;
        size += n;
    }
    if (value(&c->id, r, &p, &n)) {
        if (n > lim->max_id || text_bad(p, n, 0, 1))
            return 1;
        size += n;
    }
    if (value(&c->host, r, &p, &n))
        size += n;
    if (value(&c->txid, r, &p, &n))
        size += n;
    if (size > lim->max_size || prop_bytes > lim->max_prop_size)
        return 1;
    if (time_bad(&c->born, r) || time_bad(&c->delivery, r))
        return 1;
    {
        int64_t at = c->type.at + r;
        int8_t t = ((const int8_t *)c->type.values)[at];
        return !present(c->type.valid, at) || t < 0 || t > MAX_MESSAGE_TYPE;
    }
}

static PyObject *screen(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *schema_capsule, *array_capsule, *reserved, *out;
    Limits lim;
    Columns c;
    (void)self;
    long long *limit[5] = {&lim.max_size, &lim.max_prop_size, &lim.max_prop_num,
                           &lim.max_group, &lim.max_id};
    if (nargs != 4 || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != 5
            || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "screen takes 4 arguments: schema_capsule, "
                        "array_capsule, a tuple of 5 limits, a tuple of reserved keys");
        return NULL;
    }
    for (int k = 0; k < 5; k++) {
        *limit[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[2], k));
        if (*limit[k] == -1 && PyErr_Occurred())
            return NULL;
    }
    schema_capsule = args[0], array_capsule = args[1], reserved = args[3];
    lim.n_reserved = (int)PyTuple_GET_SIZE(reserved);
    if (lim.n_reserved > MAX_RESERVED) {
        PyErr_SetString(PyExc_ValueError, "more than 64 reserved property keys");
        return NULL;
    }
    for (int k = 0; k < lim.n_reserved; k++) {
        /* (borrowed: the tuple holds them for the call) */
        if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(reserved, k), (char **)&lim.reserved[k],
                                    &lim.reserved_len[k]) < 0)
            return NULL;
    }
    struct ArrowSchema *s;
    struct ArrowArray *a;
    int batch = exported_batch(schema_capsule, array_capsule, &s, &a);
    if (batch < 0)
        return NULL;
    if (!batch || !columns_of(s, a, &c))
        Py_RETURN_NONE;                          /* not a segment batch as exported */
    out = PyList_New(0);
    if (!out)
        return NULL;
    for (int64_t r = 0; r < a->length; r++) {
        if (row_bad(&c, &lim, r)) {
            PyObject *row = PyLong_FromLongLong(r);
            if (!row || PyList_Append(out, row) < 0) {
                Py_XDECREF(row);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(row);
        }
    }
    return out;
}

PyDoc_STRVAR(screen_doc,
"screen(schema_capsule, array_capsule, limits, reserved) -> list[int] | None\n\n"
"The rows of a SEGMENT_SCHEMA record batch exported with RecordBatch.__arrow_c_array__()\n"
"that may break an input rule of sparkmq/log/limits.py (a superset of those that do).\n"
"limits: (maxMessageSize, maxUserPropertySize, userPropertyMaxNum, maxMessageGroupSize,\n"
"maxMessageIdSize); reserved: a tuple of bytes (reserved property keys). None for a\n"
"batch whose columns are not the segment schema's.");

/* (int32 bytes of each value's length, least, greatest, sum) of the n values whose int32
 * offsets are o[0..n] (NULL with an exception set). */
static PyObject *sizes_of(const int32_t *o, int64_t n)
{
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (!sizes)
        return NULL;
    int32_t *z = (int32_t *)PyBytes_AS_STRING(sizes);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)o[i + 1] - o[i];
        z[i] = (int32_t)v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    return stolen_tuple(4, (PyObject *[]){sizes, PyLong_FromLongLong(lo),
        PyLong_FromLongLong(hi), PyLong_FromLongLong((long long)o[n] - o[0])});
}

static PyObject *body_sizes(PyObject *self, PyObject *args)
{
    Py_buffer off;
    Py_ssize_t first, n;
    PyObject *out = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nn", &off, &first, &n))
        return NULL;
    if (first < 0 || n < 1 || (off.len / 4 - 1) < first || (off.len / 4 - 1) - first < n) {
        PyErr_Format(PyExc_ValueError, "body_sizes: %zd offsets from %zd do not fit a "
                     "buffer of %zd bytes", n + 1, first, off.len);
        goto done;
    }
    out = sizes_of((const int32_t *)off.buf + first, n);
done:
    PyBuffer_Release(&off);
    return out;
}

PyDoc_STRVAR(body_sizes_doc,
"body_sizes(offsets, first, n) -> (bytes, min, max, total)\n\n"
"The byte lengths of values first..first+n-1 of a binary array whose int32 offsets are\n"
"the buffer offsets (native int32s, n >= 1), with their least, greatest and sum: what\n"
"the numpy difference and three reductions gave, in one call.");

/* The null count of array a (counted from its validity bitmap where pyarrow left it
 * unknown, -1). */
static int64_t null_count(const struct ArrowArray *a)
{
    if (a->null_count >= 0)
        return a->null_count;
    const uint8_t *v = a->n_buffers > 0 ? (const uint8_t *)a->buffers[0] : NULL;
    if (!v)
        return 0;
    int64_t nulls = 0;
    for (int64_t i = a->offset; i < a->offset + a->length; i++)
        nulls += !((v[i >> 3] >> (i & 7)) & 1);
    return nulls;
}

/* A flat column's buffer count by its format's first letter: 3 for strings and binary,
 * 2 for fixed-width values; 0 for any other format. */
static int64_t flat_buffers(const char *f)
{
    if ((f[0] == 'u' || f[0] == 'z') && !f[1])
        return 3;
    if (((f[0] == 'c' || f[0] == 'i' || f[0] == 'l') && !f[1]) || strncmp(f, "ts", 2) == 0)
        return 2;
    return 0;
}

static PyObject *send_shape(PyObject *self, PyObject *args)
{
    PyObject *schema_capsule, *array_capsule, *formats, *names = NULL, *nulls = NULL;
    PyObject *topic = NULL, *body = NULL, *out = NULL;
    int topic_at = -1, body_at = -1, empty = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO!", &schema_capsule, &array_capsule, &PyDict_Type,
                          &formats))
        return NULL;
    struct ArrowSchema *s;
    struct ArrowArray *a;
    int batch = exported_batch(schema_capsule, array_capsule, &s, &a);
    if (batch < 0)
        return NULL;
    if (!batch || a->length < 1)
        Py_RETURN_NONE;
    int64_t n = a->length, k = s->n_children;
    names = PyTuple_New(k);
    nulls = PyTuple_New(k);
    if (!names || !nulls)
        goto done;
    for (int64_t i = 0; i < k; i++) {
        const struct ArrowSchema *cs = s->children[i];
        const struct ArrowArray *ca = a->children[i];
        PyObject *name, *want, *count;
        if (!cs->name || !cs->format)
            goto none;
        if (!(name = PyUnicode_FromString(cs->name)))
            goto done;
        PyTuple_SET_ITEM(names, i, name);
        want = PyDict_GetItemWithError(formats, name);     /* borrowed */
        if (!want) {
            if (PyErr_Occurred())
                goto done;
            goto none;                   /* not a flat send column */
        }
        if (!PyBytes_Check(want) || strcmp(PyBytes_AS_STRING(want), cs->format) != 0
                || cs->n_children || ca->n_children || cs->dictionary || ca->dictionary
                || ca->length != n || ca->n_buffers != flat_buffers(cs->format)
                || !ca->buffers[1] || (ca->n_buffers == 3 && !ca->buffers[2] && n > 0))
            goto none;                   /* another type: typed() casts it */
        int64_t c = null_count(ca);
        if (!(count = PyLong_FromLongLong(c)))
            goto done;
        PyTuple_SET_ITEM(nulls, i, count);
        if (strcmp(cs->name, "topic") == 0 && c == 0)
            topic_at = (int)i;
        else if (strcmp(cs->name, "body") == 0 && c == 0)
            body_at = (int)i;
        else if ((strcmp(cs->name, "tags") == 0 || strcmp(cs->name, "message_group") == 0)
                 && c < n) {
            const uint8_t *v = validity(ca);
            const int32_t *o = (const int32_t *)ca->buffers[1] + ca->offset;
            for (int64_t r = 0; r < n && !empty; r++)
                empty = o[r + 1] == o[r] && present(v, ca->offset + r);
        }
    }
    if (topic_at >= 0) {                 /* the one topic of every row, if it is one */
        const struct ArrowArray *ca = a->children[topic_at];
        const int32_t *o = (const int32_t *)ca->buffers[1] + ca->offset;
        const char *d = (const char *)ca->buffers[2];
        int32_t len = o[1] - o[0];
        int one = 1;
        for (int64_t r = 1; r < n && one; r++)
            one = o[r + 1] - o[r] == len && memcmp(d + o[r], d + o[0], (size_t)len) == 0;
        if (one && !(topic = PyUnicode_DecodeUTF8(d + o[0], len, "strict")))
            goto done;
    }
    if (body_at >= 0) {                  /* each body's bytes, least, greatest, sum */
        const struct ArrowArray *ca = a->children[body_at];
        if (!(body = sizes_of((const int32_t *)ca->buffers[1] + ca->offset, n)))
            goto done;
    }
    out = PyTuple_Pack(5, names, nulls, topic ? topic : Py_None, body ? body : Py_None,
                       empty ? Py_True : Py_False);
    goto done;
none:
    out = Py_None;
    Py_INCREF(out);
done:
    Py_XDECREF(names);
    Py_XDECREF(nulls);
    Py_XDECREF(topic);
    Py_XDECREF(body);
    return out;
}

PyDoc_STRVAR(send_shape_doc,
"send_shape(schema_capsule, array_capsule, formats) -> tuple | None\n\n"
"What a send batch (a record batch exported with __arrow_c_array__(), valid Arrow in\n"
"full: the caller validated it) says before it is checked, in one call: (names, null\n"
"counts, the one topic every row has or None, (body sizes as int32 bytes, least,\n"
"greatest, sum) or None where a body is null, whether a tags or message_group value is\n"
"empty). formats: column name -> its Arrow C format (bytes). None, reading no value,\n"
"for a batch with a column not in formats or of another format, or nested.");

static PyMethodDef methods[] = {
    {"screen", (PyCFunction)(void (*)(void))screen, METH_FASTCALL, screen_doc},
    {"body_sizes", body_sizes, METH_VARARGS, body_sizes_doc},
    {"send_shape", send_shape, METH_VARARGS, send_shape_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sparkmq._screen",
    "The input-limit screen of a segment batch in one call (sparkmq/_screen.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__screen(void)
{
    return PyModule_Create(&module);
}
