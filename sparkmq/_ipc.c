/* sparkmq._ipc: one record batch as an encapsulated Arrow IPC message, in one call.
 *
 * record_batch_message(schema_capsule, array_capsule, key, value) takes a record batch
 * as the Arrow C data interface exports it (RecordBatch.__arrow_c_array__()) and returns
 * a bytearray holding what pyarrow's stream writer writes for it: 0xFFFFFFFF, the int32
 * length of the flatbuffer metadata (padded so the body starts 8-aligned), the metadata
 * (a Message table: version V5, a RecordBatch header with its field nodes and buffers,
 * the body length, and one custom metadata pair key=value when key is not None), then
 * the body: every buffer in the IPC order, each padded to 8 bytes. docs/FORMAT.md
 * ("Segments") and Arrow's Message.fbs / Schema.fbs define the bytes.
 *
 * Returns None, writing nothing, for a batch it does not lay out itself: an array with a
 * non-zero offset, a dictionary, an unknown null count, or a type other than the
 * fixed-width, boolean, utf8/binary, list, map, struct and null types. The caller then
 * serializes with pyarrow (the same batch to a reader). Why: one C call replaces ~10
 * pyarrow calls, and a broker's per-request cost on a shared machine is mostly the cache
 * lines its code touches.
 *
 * row_ids(prefix, first, n) writes the data of a send's ack's message ids (the id column's
 * bytes, 32 a row), which numpy took five calls to lay out; id_ack(...) writes the whole
 * ack stream of such ids (schema, batch, end marker), which took ~10 Python and pyarrow
 * calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_arrow_c.h"
#include "_capsule.h"

#define MAX_NODES 256
#define MAX_BUFFERS 768
#define MAX_DEPTH 16

typedef struct {
    int64_t nodes[MAX_NODES][2];          /* length, null count */
    int n_nodes;
    const uint8_t *data[MAX_BUFFERS];
    int64_t size[MAX_BUFFERS];
    int n_buffers;
} Layout;

static int64_t pad8(int64_t n) { return (n + 7) & ~(int64_t)7; }

static int add_buffer(Layout *L, const void *data, int64_t size)
{
    if (L->n_buffers >= MAX_BUFFERS || size < 0)
        return 0;
    L->data[L->n_buffers] = size ? (const uint8_t *)data : NULL;
    L->size[L->n_buffers] = (size && data) ? size : 0;
    if (size && !data)
        return 0;
    L->n_buffers++;
    return 1;
}

/* Byte width of a fixed-width format, 0 if it is not one. */
static int fixed_width(const char *f)
{
    if (f[0] && !f[1]) {
        switch (f[0]) {
        case 'c': case 'C': return 1;
        case 's': case 'S': case 'e': return 2;
        case 'i': case 'I': case 'f': return 4;
        case 'l': case 'L': case 'g': return 8;
        default: return 0;
        }
    }
    if (f[0] == 't' && f[1] == 's' && f[2] && f[3] == ':')      /* timestamps */
        return 8;
    if (f[0] == 't' && (f[1] == 'd' || f[1] == 't') && f[2] && !f[3])
        return (f[1] == 'd' && f[2] == 'D') || (f[1] == 't' && (f[2] == 's' || f[2] == 'm'))
            ? 4 : 8;                                               /* dates, times */
    return 0;
}

/* Appends the node and buffers of array a (type s) and of its children, depth first
   (the IPC order). 0: not laid out here. */
static int walk(const struct ArrowSchema *s, const struct ArrowArray *a, Layout *L, int depth)
{
    const char *f = s->format;
    int64_t n = a->length;
    int width;
    if (depth > MAX_DEPTH || !f || a->offset != 0 || a->dictionary || s->dictionary
            || a->null_count < 0 || n < 0 || L->n_nodes >= MAX_NODES
            || s->n_children != a->n_children)
        return 0;
    L->nodes[L->n_nodes][0] = n;
    L->nodes[L->n_nodes][1] = a->null_count;
    L->n_nodes++;
    if (f[0] == 'n' && !f[1])                  /* null: no buffers */
        return a->n_children == 0;
    if (a->n_buffers < 1)
        return 0;
    /* validity: none when no value is null (pyarrow writes an empty buffer then) */
    if (!add_buffer(L, a->null_count ? a->buffers[0] : NULL, a->null_count ? (n + 7) / 8 : 0))
        return 0;
    if ((width = fixed_width(f)) || (f[0] == 'b' && !f[1])) {
        if (a->n_buffers != 2 || a->n_children)
            return 0;
        return add_buffer(L, a->buffers[1], width ? width * n : (n + 7) / 8);
    }
    if ((f[0] == 'u' || f[0] == 'z') && !f[1]) {   /* utf8, binary: int32 offsets */
        const int32_t *off = (const int32_t *)a->buffers[1];
        if (a->n_buffers != 3 || a->n_children
                || (n && (!off || off[0] < 0 || off[n] < off[0])))
            return 0;
        if (!add_buffer(L, off, off ? 4 * (n + 1) : 0))
            return 0;
        return add_buffer(L, a->buffers[2], n ? off[n] : 0);
    }
    if (f[0] == '+' && (f[1] == 'l' || f[1] == 'm') && !f[2]) {   /* list, map */
        const int32_t *off = (const int32_t *)a->buffers[1];
        if (a->n_buffers != 2 || a->n_children != 1
                || (n && (!off || off[0] < 0 || off[n] < off[0])))
            return 0;
        if (!add_buffer(L, off, off ? 4 * (n + 1) : 0))
            return 0;
        return walk(s->children[0], a->children[0], L, depth + 1);
    }
    if (f[0] == '+' && f[1] == 's' && !f[2]) {     /* struct */
        if (a->n_buffers != 1)
            return 0;
        for (int64_t i = 0; i < a->n_children; i++)
            if (!walk(s->children[i], a->children[i], L, depth + 1))
                return 0;
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- flatbuffer writing */
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }

/* A flatbuffer string (u32 length, bytes, NUL) at p; returns its size padded to 4. */
static Py_ssize_t put_string(uint8_t *p, const char *s, Py_ssize_t n)
{
    put32(p, (uint32_t)n);
    memcpy(p + 4, s, n);
    p[4 + n] = 0;
    return (4 + n + 1 + 3) & ~(Py_ssize_t)3;
}

/* The Message flatbuffer laid out front to back (offsets from its start, F):
 *   0 root offset; 4 Message vtable (14 bytes); 24 Message table (24 bytes);
 *   48 RecordBatch vtable (10 bytes); 64 RecordBatch table (24 bytes);
 *   88 nodes vector (count at 92, 16-byte structs from 96, 8-aligned);
 *   buffers vector likewise; then the custom metadata: a vector of one KeyValue
 *   offset, its vtable, its table, the key and value strings.
 * Every scalar sits at a multiple of its size from F, and F is 8 bytes into the message
 * (which starts 8-aligned), as a flatbuffer verifier checking alignment wants. */
static Py_ssize_t metadata_size(const Layout *L, Py_ssize_t klen, Py_ssize_t vlen)
{
    Py_ssize_t size = 96 + 16 * L->n_nodes + 8 + 16 * L->n_buffers;
    if (klen >= 0)
        size += 28 + ((4 + klen + 1 + 3) & ~3) + ((4 + vlen + 1 + 3) & ~3);
    return pad8(size);
}

static Py_ssize_t write_metadata(uint8_t *F, const Layout *L, int64_t length, int64_t body,
                                 const char *key, Py_ssize_t klen, const char *value,
                                 Py_ssize_t vlen)
{
    Py_ssize_t p, q, at;
    put32(F, 24);                               /* root: the Message table */
    /* Message vtable: fields version(0), header_type(1), header(2), bodyLength(3),
       custom_metadata(4) */
    put16(F + 4, 14); put16(F + 6, 24);
    put16(F + 8, 20); put16(F + 10, 22); put16(F + 12, 4); put16(F + 14, 8);
    put16(F + 16, klen >= 0 ? 16 : 0);
    put32(F + 24, 24 - 4);                      /* soffset: table - vtable */
    put32(F + 28, 64 - 28);                     /* header -> RecordBatch table */
    put64(F + 32, body);
    put16(F + 44, 4);                           /* MetadataVersion V5 */
    F[46] = 3;                                  /* MessageHeader RecordBatch */
    /* RecordBatch vtable: length(0), nodes(1), buffers(2) */
    put16(F + 48, 10); put16(F + 50, 24);
    put16(F + 52, 8); put16(F + 54, 4); put16(F + 56, 16);
    put32(F + 64, 64 - 48);
    put32(F + 68, 92 - 68);                     /* nodes vector (its count) */
    put64(F + 72, length);
    put32(F + 92, (uint32_t)L->n_nodes);
    for (int i = 0; i < L->n_nodes; i++) {
        put64(F + 96 + 16 * i, L->nodes[i][0]);
        put64(F + 104 + 16 * i, L->nodes[i][1]);
    }
    p = 96 + 16 * L->n_nodes;                   /* 8-aligned: the count at p + 4 */
    put32(F + 80, (uint32_t)(p + 4 - 80));
    put32(F + p + 4, (uint32_t)L->n_buffers);
    at = 0;
    for (int i = 0; i < L->n_buffers; i++) {
        put64(F + p + 8 + 16 * i, at);
        put64(F + p + 16 + 16 * i, L->size[i]);
        at += pad8(L->size[i]);
    }
    if (klen < 0)
        return -1;
    q = p + 8 + 16 * L->n_buffers;              /* the custom metadata vector */
    put32(F + 40, (uint32_t)(q - 40));
    put32(F + q, 1);
    put32(F + q + 4, (uint32_t)(q + 16 - (q + 4)));   /* -> the KeyValue table */
    put16(F + q + 8, 8); put16(F + q + 10, 12); put16(F + q + 12, 4); put16(F + q + 14, 8);
    put32(F + q + 16, 8);                       /* soffset to its vtable */
    put32(F + q + 20, (uint32_t)(q + 28 - (q + 20)));
    at = q + 28 + put_string(F + q + 28, key, klen);
    put32(F + q + 24, (uint32_t)(at - (q + 24)));
    put_string(F + at, value, vlen);
    return at + 4;                              /* the value's first byte */
}

/* The first place in [p, p + n) where the mark_len bytes of mark start (mark itself lies
   in that range), found by its first byte: memmem's set-up costs more than this scan of
   a message's few hundred bytes of metadata, where that byte is rare. */
static const uint8_t *first_at(const uint8_t *p, Py_ssize_t n, const uint8_t *mark,
                               Py_ssize_t mark_len)
{
    const uint8_t *end = p + n - mark_len;
    for (const uint8_t *q = p; q <= end; q++) {
        q = memchr(q, mark[0], (size_t)(end - q) + 1);
        if (!q)
            return NULL;
        if (memcmp(q, mark, (size_t)mark_len) == 0)
            return q;
    }
    return NULL;
}

/* Fills the checksum digits: the last 8 bytes of the custom metadata's value, where the
   value's text before them must be the first occurrence of that text in the metadata (a
   reader finds the digits by searching for it). crc(data, value) is crc32c.crc32c; the
   checksum covers the whole message but the digits. 0 with no error set: the digits are
   not where a reader would look. -1: an error is set. */
static int seal(uint8_t *msg, Py_ssize_t total, Py_ssize_t meta, Py_ssize_t at,
                Py_ssize_t mark_len, PyObject *crc)
{
    static const char hex[] = "0123456789abcdef";
    PyObject *args[2], *r;
    unsigned long value;
    const uint8_t *mark = msg + at - mark_len;
    if (mark < msg + 8 || mark_len < 1 || first_at(msg + 8, meta, mark, mark_len) != mark)
        return 0;
    args[0] = PyMemoryView_FromMemory((char *)msg, at, PyBUF_READ);
    if (!args[0])
        return -1;
    r = PyObject_Vectorcall(crc, args, 1, NULL);
    Py_DECREF(args[0]);
    if (!r)
        return -1;
    args[0] = PyMemoryView_FromMemory((char *)msg + at + 8, total - at - 8, PyBUF_READ);
    if (!args[0]) {
        Py_DECREF(r);
        return -1;
    }
    args[1] = r;
    Py_SETREF(r, PyObject_Vectorcall(crc, args, 2, NULL));
    Py_DECREF(args[0]);
    if (!r)
        return -1;
    value = PyLong_AsUnsignedLong(r);
    Py_DECREF(r);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    for (int i = 7; i >= 0; i--, value >>= 4)
        msg[at + i] = hex[value & 15];
    return 1;
}

/* A body this long or longer is copied without the GIL (as pyarrow's writer does), so a
   large batch's copy does not hold up the process's other threads. */
#define RELEASE_GIL_BYTES (1 << 20)

static void copy_body(uint8_t *dst, const Layout *L)
{
    for (int i = 0; i < L->n_buffers; i++) {
        int64_t n = L->size[i], padded = pad8(n);
        if (n)
            memcpy(dst, L->data[i], n);
        if (padded > n)
            memset(dst + n, 0, padded - n);
        dst += padded;
    }
}

/* The message of layout L (length rows) as a new bytearray; with key/value as its custom
   metadata, sealed by crc when crc is not None (see seal). None: not sealable. */
static PyObject *message(const Layout *L, int64_t length, const char *key, Py_ssize_t klen,
                         const char *value, Py_ssize_t vlen, PyObject *crc)
{
    Py_ssize_t meta, total, at;
    int64_t body = 0;
    uint8_t *dst, *msg;
    PyObject *out;
    for (int i = 0; i < L->n_buffers; i++)
        body += pad8(L->size[i]);
    meta = metadata_size(L, klen, vlen);
    total = 8 + meta + body;
    out = PyByteArray_FromStringAndSize(NULL, total);
    if (!out)
        return NULL;
    msg = dst = (uint8_t *)PyByteArray_AS_STRING(out);
    memset(dst, 0, 8 + meta);
    put32(dst, 0xFFFFFFFFu);
    put32(dst + 4, (uint32_t)meta);
    at = write_metadata(dst + 8, L, length, body, key, klen, value, vlen);
    dst += 8 + meta;
    if (body >= RELEASE_GIL_BYTES) {
        /* (the buffers are the caller's, alive for the call; the bytearray is new) */
        Py_BEGIN_ALLOW_THREADS
        copy_body(dst, L);
        Py_END_ALLOW_THREADS
    } else {
        copy_body(dst, L);
    }
    if (crc != Py_None) {
        int sealed = (klen >= 0 && vlen >= 8) ?
            seal(msg, total, meta, 8 + at + vlen - 8, vlen - 8, crc) : 0;
        if (sealed <= 0) {
            Py_DECREF(out);
            if (sealed < 0)
                return NULL;
            Py_RETURN_NONE;
        }
    }
    return out;
}

/* A bytes argument of record_batch_message as text and length; None: NULL, -1. */
static int text_arg(PyObject *o, const char **text, Py_ssize_t *len, const char *what)
{
    if (o == Py_None) {
        *text = NULL, *len = -1;
        return 1;
    }
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "record_batch_message: %s must be bytes or None, not %.80s",
                     what, Py_TYPE(o)->tp_name);
        return 0;
    }
    *text = PyBytes_AS_STRING(o), *len = PyBytes_GET_SIZE(o);
    return 1;
}

static PyObject *record_batch_message(PyObject *self, PyObject *const *args,
                                      Py_ssize_t nargs)
{
    PyObject *crc = nargs > 4 ? args[4] : Py_None;
    const char *key, *value;
    Py_ssize_t klen, vlen;
    Layout L;                               /* (~16 KB: on the stack, not allocated) */
    (void)self;
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "record_batch_message takes 4 or 5 arguments: "
                        "schema_capsule, array_capsule, key, value[, crc]");
        return NULL;
    }
    if (!text_arg(args[2], &key, &klen, "key") || !text_arg(args[3], &value, &vlen, "value"))
        return NULL;
    if (!key || !value)
        klen = -1, vlen = 0;
    struct ArrowSchema *s;
    struct ArrowArray *a;
    int batch = exported_batch(args[0], args[1], &s, &a);
    if (batch < 0)
        return NULL;
    if (!batch)
        Py_RETURN_NONE;                          /* not a record batch as exported */
    L.n_nodes = L.n_buffers = 0;
    for (int64_t i = 0; i < a->n_children; i++) {
        if (!walk(s->children[i], a->children[i], &L, 0))
            Py_RETURN_NONE;
    }
    return message(&L, a->length, key, klen, value, vlen, crc);
}

/* message_of_buffers(length, nodes, buffers): a record batch message from its parts. */
static PyObject *message_of_buffers(PyObject *self, PyObject *args)
{
    long long length;
    PyObject *nodes, *buffers, *out = NULL;
    Py_buffer views[MAX_BUFFERS];
    Py_ssize_t nn, nb, held = 0;
    Layout *L;
    (void)self;
    if (!PyArg_ParseTuple(args, "LO!O!", &length, &PyTuple_Type, &nodes, &PyTuple_Type,
                          &buffers))
        return NULL;
    nn = PyTuple_GET_SIZE(nodes);
    nb = PyTuple_GET_SIZE(buffers);
    if (nn > MAX_NODES || nb > MAX_BUFFERS || length < 0) {
        PyErr_SetString(PyExc_ValueError, "too many nodes or buffers, or a negative length");
        return NULL;
    }
    L = PyMem_Malloc(sizeof(Layout));
    if (!L)
        return PyErr_NoMemory();
    L->n_nodes = (int)nn;
    L->n_buffers = (int)nb;
    for (Py_ssize_t i = 0; i < nn; i++) {
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(nodes, i), "LL", &L->nodes[i][0],
                              &L->nodes[i][1]))
            goto done;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        PyObject *b = PyTuple_GET_ITEM(buffers, i);
        L->data[i] = NULL;
        L->size[i] = 0;
        if (b == Py_None)
            continue;
        if (PyObject_GetBuffer(b, &views[held], PyBUF_SIMPLE) < 0)
            goto done;
        L->data[i] = views[held].buf;
        L->size[i] = views[held].len;
        held++;
    }
    out = message(L, length, NULL, -1, NULL, 0, Py_None);
done:
    while (held > 0)
        PyBuffer_Release(&views[--held]);
    PyMem_Free(L);
    return out;
}

/* An empty ArrowArray in a capsule named "arrow_array": pyarrow exports a batch's arrays
 * into it (RecordBatch._export_to_c(address)) without its schema, which the caller has
 * exported once; the capsule releases what was exported into it and frees it. */
static PyObject *array_capsule(PyObject *self, PyObject *noargs)
{
    struct ArrowArray *a = PyMem_Calloc(1, sizeof(struct ArrowArray));
    PyObject *capsule;
    (void)self;
    (void)noargs;
    if (!a)
        return PyErr_NoMemory();
    capsule = PyCapsule_New(a, "arrow_array", free_array_capsule);
    if (!capsule) {
        PyMem_Free(a);
        return NULL;
    }
    return capsule_and_address(capsule, a);
}

/* row_ids(prefix, first, n): the data of n message ids, 32 ASCII bytes each: prefix (24
 * bytes) and the row number first + j as 8 upper-case hex digits (log/message.py's
 * encode_message_id). None for a row past 0xFFFFFFFF (eight digits no longer hold it). */
static void fill_ids(char *p, const char *prefix, long long first, Py_ssize_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    for (Py_ssize_t j = 0; j < n; j++, p += 32) {
        uint32_t row = (uint32_t)(first + j);
        memcpy(p, prefix, 24);
        for (int d = 7; d >= 0; d--, row >>= 4)
            p[24 + d] = hex[row & 0xF];
    }
}

/* 0: the arguments of row_ids / id_ack are usable; -1: an error set; 1: a row past
   0xFFFFFFFF (None). */
static int check_ids(Py_ssize_t plen, long long first, Py_ssize_t n)
{
    if (plen != 24 || n < 0 || first < 0) {
        PyErr_SetString(PyExc_ValueError, "a 24-byte prefix and rows from 0");
        return -1;
    }
    return first + (long long)n - 1 > 0xFFFFFFFFLL;
}

static PyObject *row_ids(PyObject *self, PyObject *args)
{
    const char *prefix;
    Py_ssize_t plen, n;
    long long first;
    PyObject *out;
    int bad;
    (void)self;
    if (!PyArg_ParseTuple(args, "y#Ln", &prefix, &plen, &first, &n))
        return NULL;
    if ((bad = check_ids(plen, first, n)))
        return bad < 0 ? NULL : Py_NewRef(Py_None);
    out = PyBytes_FromStringAndSize(NULL, n * 32);
    if (out)
        fill_ids(PyBytes_AS_STRING(out), prefix, first, n);
    return out;
}

/* id_ack(schema_message, end, queue_ids, queue_offsets, prefix, first): a send's whole ack
 * stream (the flight module's ACK_SCHEMA) in one call: the schema's message, one record
 * batch message of the rows' queue ids (int32), queue offsets (int64) and message ids
 * (row_ids' layout, rows first..), then end (the end-of-stream marker). None for a row
 * past 0xFFFFFFFF or buffers of other sizes than n rows. */
static PyObject *id_ack(PyObject *self, PyObject *args)
{
    Py_buffer head, end, qids, qos;
    const char *prefix;
    Py_ssize_t plen, n;
    long long first;
    PyObject *batch = NULL, *out = NULL;
    int32_t *offsets = NULL;
    char *ids = NULL;
    int bad;
    Layout *L = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y#L", &head, &end, &qids, &qos, &prefix, &plen,
                          &first))
        return NULL;
    n = qids.len / 4;
    if ((bad = check_ids(plen, first, n)) < 0)
        goto done;
    if (bad || qids.len != 4 * n || qos.len != 8 * n || 32 * (long long)n > INT32_MAX) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    offsets = PyMem_Malloc(4 * (n + 1));
    ids = PyMem_Malloc(32 * n + 1);
    L = PyMem_Malloc(sizeof(Layout));
    if (!offsets || !ids || !L) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j <= n; j++)
        offsets[j] = (int32_t)(32 * j);
    fill_ids(ids, prefix, first, n);
    L->n_nodes = 3;
    for (int i = 0; i < 3; i++)
        L->nodes[i][0] = n, L->nodes[i][1] = 0;
    L->n_buffers = 0;
    add_buffer(L, NULL, 0);
    add_buffer(L, qids.buf, 4 * n);
    add_buffer(L, NULL, 0);
    add_buffer(L, qos.buf, 8 * n);
    add_buffer(L, NULL, 0);
    add_buffer(L, offsets, 4 * (n + 1));
    add_buffer(L, ids, 32 * n);
    batch = message(L, n, NULL, -1, NULL, 0, Py_None);
    if (!batch)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, head.len + PyByteArray_GET_SIZE(batch) + end.len);
    if (out) {
        char *p = PyBytes_AS_STRING(out);
        memcpy(p, head.buf, head.len);
        memcpy(p + head.len, PyByteArray_AS_STRING(batch), PyByteArray_GET_SIZE(batch));
        memcpy(p + head.len + PyByteArray_GET_SIZE(batch), end.buf, end.len);
    }
done:
    Py_XDECREF(batch);
    PyMem_Free(offsets);
    PyMem_Free(ids);
    PyMem_Free(L);
    PyBuffer_Release(&head);
    PyBuffer_Release(&end);
    PyBuffer_Release(&qids);
    PyBuffer_Release(&qos);
    return out;
}

PyDoc_STRVAR(row_ids_doc,
"row_ids(prefix, first, n) -> bytes | None\n\n"
"The bytes of n message ids: the 24-byte prefix, then the row first + j as 8 upper-case\n"
"hex digits, 32 bytes an id. None if a row exceeds 0xFFFFFFFF.");

PyDoc_STRVAR(id_ack_doc,
"id_ack(schema_message, end, queue_ids, queue_offsets, prefix, first) -> bytes | None\n\n"
"A send's ack stream: the schema message, one batch of the queue ids (int32), queue\n"
"offsets (int64) and the message ids of rows first.. (row_ids' layout), then end. None\n"
"for a row past 0xFFFFFFFF or buffers not of one length.");

PyDoc_STRVAR(array_capsule_doc,
"array_capsule() -> (capsule, address)\n\n"
"An empty ArrowArray struct in an \"arrow_array\" capsule, and its address for\n"
"RecordBatch._export_to_c(address): the arrays exported without the schema. The\n"
"capsule releases the export when it goes.");

PyDoc_STRVAR(record_batch_message_doc,
"record_batch_message(schema_capsule, array_capsule, key, value, crc=None)\n"
"    -> bytearray | None\n\n"
"The encapsulated Arrow IPC message of a record batch exported with\n"
"RecordBatch.__arrow_c_array__(), with custom metadata key=value (both None: none).\n"
"crc (crc32c.crc32c): the value's last 8 bytes become the CRC32C of the message without\n"
"them, as 8 lower-case hex digits. None for a batch this module does not lay out.");

PyDoc_STRVAR(message_of_buffers_doc,
"message_of_buffers(length, nodes, buffers) -> bytearray\n\n"
"A record batch message of length rows from its field nodes (a tuple of\n"
"(length, null_count)) and buffers (a tuple of buffer-protocol objects or None), in\n"
"the IPC order; the caller vouches that they match the schema.");

static PyMethodDef methods[] = {
    {"record_batch_message", (PyCFunction)(void (*)(void))record_batch_message,
     METH_FASTCALL, record_batch_message_doc},
    {"message_of_buffers", message_of_buffers, METH_VARARGS, message_of_buffers_doc},
    {"array_capsule", array_capsule, METH_NOARGS, array_capsule_doc},
    {"row_ids", row_ids, METH_VARARGS, row_ids_doc},
    {"id_ack", id_ack, METH_VARARGS, id_ack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sparkmq._ipc",
    "One record batch as an encapsulated Arrow IPC message (sparkmq/_ipc.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ipc(void)
{
    return PyModule_Create(&module);
}
