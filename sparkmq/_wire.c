/* sparkmq._wire: the RocketMQ 5 SendMessage request of plain messages (NORMAL, one
 * topic, each with its id, born host and time; a tag and keys or not) turned into
 * column buffers, and its all-OK answer turned into bytes, without a Python object
 * per message (docs/ARCHITECTURE.md, "The plain gRPC send"); those buffers as one Arrow
 * C struct, what the send's segment batch is composed from (``plain_struct``); and, for
 * sparkmq's Producer, such a request made from the bodies (``encode_plain``), and the
 * Flight batch of the same messages (``send_struct``).
 *
 * Input is the client's bytes, read before upb sees them: every read is bounds-checked,
 * and the scanner accepts nothing upb would refuse (every string field it takes, the
 * body digest's too, is checked to be well-formed UTF-8, as upb checks a proto3 string;
 * any field it does not know is declined). Bytes that are not what it expects give None
 * (the caller then parses them with upb: the general path or BAD_REQUEST), never a crash.
 *
 * Field numbers: apache/rocketmq-apis, apache/rocketmq/v2/definition.proto and
 * service.proto (SendMessageRequest, Message, Resource, SystemProperties, Timestamp,
 * SendMessageResponse, SendResultEntry).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_arrow_c.h"
#include "_capsule.h"

typedef struct {
    const uint8_t *p, *end;
} Cursor;

/* One message's fields, as pointers into the request. */
typedef struct {
    const uint8_t *topic, *body, *id, *host, *tag, *sys;
    Py_ssize_t topic_len, body_len, id_len, host_len, tag_len, sys_len;
    Py_ssize_t nkeys, key_bytes;     /* its keys (field 2 of ``sys``, read again to copy) */
    int64_t born_ms;
} Plain;

static int read_varint(Cursor *c, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && c->p < c->end; shift += 7) {
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static int read_bytes(Cursor *c, const uint8_t **start, Py_ssize_t *len)
{
    uint64_t n;
    if (read_varint(c, &n) || n > (uint64_t)(c->end - c->p))
        return -1;
    *start = c->p;
    *len = (Py_ssize_t)n;
    c->p += n;
    return 0;
}

/* The next field's number and wire type; -1 at a malformed key. */
static int read_key(Cursor *c, uint32_t *field, uint32_t *wire)
{
    uint64_t key;
    if (read_varint(c, &key) || key >> 32)
        return -1;
    *field = (uint32_t)(key >> 3);
    *wire = (uint32_t)(key & 7);
    return 0;
}

static int skip_value(Cursor *c, uint32_t wire)
{
    uint64_t v;
    const uint8_t *s;
    Py_ssize_t n;
    switch (wire) {
    case 0: return read_varint(c, &v);
    case 1: if (c->end - c->p < 8) return -1; c->p += 8; return 0;
    case 2: return read_bytes(c, &s, &n);
    case 5: if (c->end - c->p < 4) return -1; c->p += 4; return 0;
    default: return -1;
    }
}

/* 1 if s[0, n) is well-formed UTF-8, as upb requires of a proto3 string field (the
 * Unicode standard's table 3-7: no overlong form, no surrogate, nothing past U+10FFFF). */
static int utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) {                    /* eight ASCII bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int need;
        uint8_t lo = 0x80, hi = 0xBF;      /* the second byte's range */
        if (b >= 0xC2 && b <= 0xDF)
            need = 1;
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0)
                lo = 0xA0;
            else if (b == 0xED)
                hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0)
                lo = 0x90;
            else if (b == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (int k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += need + 1;
    }
    return 1;
}

/* A length-delimited string field's value, if it is well-formed UTF-8; -1 otherwise. */
static int read_string(Cursor *c, const uint8_t **start, Py_ssize_t *len)
{
    return read_bytes(c, start, len) || !utf8_valid(*start, *len) ? -1 : 0;
}

/* Digest: type (1), checksum (2, a string); not kept, but checked as upb checks it. */
static int scan_digest(const uint8_t *p, Py_ssize_t len)
{
    Cursor c = {p, p + len};
    uint32_t field, wire;
    uint64_t v;
    const uint8_t *s;
    Py_ssize_t n;
    while (c.p < c.end) {
        if (read_key(&c, &field, &wire))
            return -1;
        if (field == 1 && wire == 0) {
            if (read_varint(&c, &v))
                return -1;
        } else if (field == 2 && wire == 2) {
            if (read_string(&c, &s, &n))
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Resource: the name (2); the namespace (1) is not part of a topic here. */
static int scan_resource(const uint8_t *p, Py_ssize_t len, Plain *m)
{
    Cursor c = {p, p + len};
    uint32_t field, wire;
    int seen = 0;
    while (c.p < c.end) {
        if (read_key(&c, &field, &wire))
            return -1;
        if (field == 2 && wire == 2 && !seen) {
            if (read_string(&c, &m->topic, &m->topic_len))
                return -1;
            seen = 1;
        } else if (field == 1 && wire == 2) {
            const uint8_t *s;
            Py_ssize_t n;
            if (read_string(&c, &s, &n))
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Timestamp: seconds (1), nanos (2); milliseconds, -1 unless both are >= 0. */
static int scan_timestamp(const uint8_t *p, Py_ssize_t len, int64_t *ms)
{
    Cursor c = {p, p + len};
    uint32_t field, wire;
    uint64_t seconds = 0, nanos = 0;
    while (c.p < c.end) {
        if (read_key(&c, &field, &wire) || wire != 0)
            return -1;
        if (field == 1) {
            if (read_varint(&c, &seconds))
                return -1;
        } else if (field == 2) {
            if (read_varint(&c, &nanos))
                return -1;
        } else {
            return -1;
        }
    }
    /* a negative int64 or int32 is a varint with the top bit set */
    if (seconds > (uint64_t)INT64_MAX / 1000 || nanos >= 1000000000u)
        return -1;
    *ms = (int64_t)seconds * 1000 + (int64_t)(nanos / 1000000u);
    return 0;
}

/* SystemProperties of a plain message: tag (1; empty is none), keys (2, repeated),
 * message_id (3), body_digest (4, checked, not kept), body_encoding (5, not GZIP), message_type
 * (6, NORMAL), born_timestamp (7), born_host (8). Any other field, or one of these but
 * keys twice, is not plain. */
static int scan_system(const uint8_t *p, Py_ssize_t len, Plain *m)
{
    Cursor c = {p, p + len};
    uint32_t field, wire, seen = 0;
    uint64_t v;
    const uint8_t *s;
    Py_ssize_t n;
    int normal = 0;
    m->sys = p;
    m->sys_len = len;
    while (c.p < c.end) {
        if (read_key(&c, &field, &wire) || field < 1 || field > 8
                || (field != 2 && (seen >> field) & 1))
            return -1;
        seen |= 1u << field;
        switch (field) {
        case 1:
            if (wire != 2 || read_string(&c, &m->tag, &m->tag_len))
                return -1;
            break;
        case 2:
            if (wire != 2 || read_string(&c, &s, &n))
                return -1;
            m->nkeys++;
            m->key_bytes += n;
            break;
        case 3:
            if (wire != 2 || read_string(&c, &m->id, &m->id_len))
                return -1;
            break;
        case 4:
            if (wire != 2 || read_bytes(&c, &s, &n) || scan_digest(s, n))
                return -1;
            break;
        case 5:
            if (wire != 0 || read_varint(&c, &v) || v == 2)   /* GZIP */
                return -1;
            break;
        case 6:
            if (wire != 0 || read_varint(&c, &v) || v != 1)   /* NORMAL */
                return -1;
            normal = 1;
            break;
        case 7:
            if (wire != 2 || read_bytes(&c, &s, &n) || scan_timestamp(s, n, &m->born_ms))
                return -1;
            break;
        case 8:
            if (wire != 2 || read_string(&c, &m->host, &m->host_len))
                return -1;
            break;
        }
    }
    /* an empty id or host, or no born time, is the general path's (it reads them as none) */
    return normal && m->id_len > 0 && m->host_len > 0 && m->born_ms > 0 ? 0 : -1;
}

/* Message: topic (1), system_properties (3), body (4); user properties (2) or any
 * other field are not plain. */
static int scan_message(const uint8_t *p, Py_ssize_t len, Plain *m)
{
    Cursor c = {p, p + len};
    uint32_t field, wire, seen = 0;
    const uint8_t *s;
    Py_ssize_t n;
    memset(m, 0, sizeof *m);
    while (c.p < c.end) {
        if (read_key(&c, &field, &wire) || wire != 2 || read_bytes(&c, &s, &n))
            return -1;
        if ((field != 1 && field != 3 && field != 4) || (seen >> field) & 1)
            return -1;
        seen |= 1u << field;
        if (field == 1 && scan_resource(s, n, m))
            return -1;
        if (field == 3 && scan_system(s, n, m))
            return -1;
        if (field == 4) {
            m->body = s;
            m->body_len = n;
        }
    }
    return (seen & (1u << 3)) && m->topic_len > 0 ? 0 : -1;
}

static const uint8_t *value_of(const Plain *m, int which, Py_ssize_t *n)
{
    switch (which) {
    case 0: *n = m->body_len; return m->body;
    case 1: *n = m->id_len; return m->id;
    case 2: *n = m->host_len; return m->host;
    default: *n = m->tag_len; return m->tag;
    }
}

/* A bytes object of ``count`` + 1 int32 offsets and one of the values they delimit:
 * the Arrow layout of a string or binary column (an absent tag: empty, see ``bits``).
 * 1: too large for int32 offsets (the general path's); -1: out of memory. */
static int column(const Plain *ms, Py_ssize_t count, int which, PyObject **offsets,
                  PyObject **data)
{
    Py_ssize_t total = 0, n;
    for (Py_ssize_t i = 0; i < count; i++) {
        value_of(&ms[i], which, &n);
        total += n;
    }
    if (total > INT32_MAX)
        return 1;
    *offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
    *data = PyBytes_FromStringAndSize(NULL, total);
    if (*offsets == NULL || *data == NULL)
        return -1;
    int32_t *off = (int32_t *)PyBytes_AS_STRING(*offsets);
    char *out = PyBytes_AS_STRING(*data);
    int32_t at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *v = value_of(&ms[i], which, &n);
        off[i] = at;
        if (n)
            memcpy(out + at, v, (size_t)n);
        at += (int32_t)n;
    }
    off[count] = at;
    return 0;
}

/* An Arrow validity bitmap of ``count`` rows: a row's tag (``which`` 3) or keys (4)
 * are valid when present and not empty; ``nulls`` gets the others' count. */
static PyObject *bits(const Plain *ms, Py_ssize_t count, int which, Py_ssize_t *nulls)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, (count + 7) / 8);
    if (out == NULL)
        return NULL;
    uint8_t *b = (uint8_t *)PyBytes_AS_STRING(out);
    memset(b, 0, (size_t)((count + 7) / 8));
    *nulls = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (which == 3 ? ms[i].tag_len > 0 : ms[i].nkeys > 0)
            b[i / 8] |= (uint8_t)(1u << (i % 8));
        else
            (*nulls)++;
    }
    return out;
}

/* The keys as a list<string> column's buffers: per row an int32 offset into the
 * values, the values' int32 offsets and their bytes (read again from each ``sys``). */
static int keys_column(const Plain *ms, Py_ssize_t count, PyObject **lists,
                       PyObject **offsets, PyObject **data)
{
    Py_ssize_t nvalues = 0, total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        nvalues += ms[i].nkeys;
        total += ms[i].key_bytes;
    }
    if (total > INT32_MAX || nvalues > INT32_MAX)
        return 1;
    *lists = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
    *offsets = PyBytes_FromStringAndSize(NULL, (nvalues + 1) * 4);
    *data = PyBytes_FromStringAndSize(NULL, total);
    if (*lists == NULL || *offsets == NULL || *data == NULL)
        return -1;
    int32_t *lo = (int32_t *)PyBytes_AS_STRING(*lists);
    int32_t *vo = (int32_t *)PyBytes_AS_STRING(*offsets);
    char *out = PyBytes_AS_STRING(*data);
    int32_t value = 0, at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        lo[i] = value;
        Cursor c = {ms[i].sys, ms[i].sys + ms[i].sys_len};
        uint32_t field, wire;
        const uint8_t *s;
        Py_ssize_t n;
        /* scan_system read these same bytes without error */
        for (Py_ssize_t k = 0; k < ms[i].nkeys && c.p < c.end;) {
            if (read_key(&c, &field, &wire))
                return 1;
            if (field != 2) {
                if (skip_value(&c, wire))
                    return 1;
                continue;
            }
            if (read_bytes(&c, &s, &n) || at + n > total)
                return 1;
            vo[value++] = at;
            if (n)
                memcpy(out + at, s, (size_t)n);
            at += (int32_t)n;
            k++;
        }
    }
    lo[count] = value;
    vo[value] = at;
    return value == nvalues && at == total ? 0 : 1;
}

PyDoc_STRVAR(scan_plain_doc,
"scan_plain(data, min_messages=1) -> tuple | None\n\n"
"A serialized SendMessageRequest of at least min_messages messages that are all plain\n"
"(one topic; NORMAL; a message id, born host and born time each; tag and keys or not;\n"
"no group, properties, delivery time or gzip; nothing else; every string well-formed\n"
"UTF-8) as (topic: bytes, rows, bodies and their int32 offsets, message ids and\n"
"offsets, born hosts and offsets, born times as int64 ms, tags' validity bitmap, null\n"
"count, offsets and bytes, keys' validity bitmap, null count, list offsets, value\n"
"offsets and bytes); None for any other. What it accepts, upb parses to the same.");

static PyObject *scan_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t min_messages = 1;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "scan_plain(data, min_messages=1)");
        return NULL;
    }
    if (nargs == 2) {
        min_messages = PyLong_AsSsize_t(args[1]);
        if (min_messages == -1 && PyErr_Occurred())
            return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE))
        return NULL;
    PyObject *result = NULL, *cols[8] = {0}, *keys[3] = {0};
    PyObject *topic = NULL, *borns = NULL, *tag_bits = NULL, *key_bits = NULL;
    Py_ssize_t tag_nulls = 0, key_nulls = 0;
    Plain *ms = NULL;
    Cursor c = {view.buf, (const uint8_t *)view.buf + view.len};
    uint32_t field, wire;
    const uint8_t *s;
    Py_ssize_t n, count = 0;
    while (c.p < c.end) {                          /* count the messages first */
        if (read_key(&c, &field, &wire) || field != 1 || wire != 2 || read_bytes(&c, &s, &n))
            goto plain_no;
        count++;
    }
    if (count == 0 || count < min_messages)
        goto plain_no;
    ms = PyMem_Malloc(sizeof(Plain) * (size_t)count);
    if (ms == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    c.p = view.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        read_key(&c, &field, &wire);
        read_bytes(&c, &s, &n);
        if (scan_message(s, n, &ms[i]))
            goto plain_no;
        if (ms[i].topic_len != ms[0].topic_len
                || memcmp(ms[i].topic, ms[0].topic, (size_t)ms[0].topic_len))
            goto plain_no;
    }
    for (int k = 0; k < 4; k++) {
        int r = column(ms, count, k, &cols[2 * k], &cols[2 * k + 1]);
        if (r < 0)
            goto done;
        if (r > 0)
            goto plain_no;
    }
    int r = keys_column(ms, count, &keys[0], &keys[1], &keys[2]);
    if (r < 0)
        goto done;
    if (r > 0)
        goto plain_no;
    topic = PyBytes_FromStringAndSize((const char *)ms[0].topic, ms[0].topic_len);
    borns = PyBytes_FromStringAndSize(NULL, count * 8);
    tag_bits = bits(ms, count, 3, &tag_nulls);
    key_bits = bits(ms, count, 4, &key_nulls);
    if (topic == NULL || borns == NULL || tag_bits == NULL || key_bits == NULL)
        goto done;
    int64_t *born = (int64_t *)PyBytes_AS_STRING(borns);
    for (Py_ssize_t i = 0; i < count; i++)
        born[i] = ms[i].born_ms;
    /* (PyTuple_Pack, not Py_BuildValue: reading an 18-item format cost ~4 k instructions
       a request) */
    PyObject *n_obj = PyLong_FromSsize_t(count), *tn_obj = PyLong_FromSsize_t(tag_nulls);
    PyObject *kn_obj = PyLong_FromSsize_t(key_nulls);
    if (n_obj && tn_obj && kn_obj)
        result = PyTuple_Pack(18, topic, n_obj, cols[1], cols[0], cols[3], cols[2], cols[5],
                              cols[4], borns, tag_bits, tn_obj, cols[6], cols[7], key_bits,
                              kn_obj, keys[0], keys[1], keys[2]);
    Py_XDECREF(n_obj);
    Py_XDECREF(tn_obj);
    Py_XDECREF(kn_obj);
    goto done;
plain_no:
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < 8; k++)
        Py_XDECREF(cols[k]);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(keys[k]);
    Py_XDECREF(topic);
    Py_XDECREF(borns);
    Py_XDECREF(tag_bits);
    Py_XDECREF(key_bits);
    PyMem_Free(ms);
    PyBuffer_Release(&view);
    return result;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

PyDoc_STRVAR(encode_ok_doc,
"encode_ok(status, ids, id_offsets, offsets) -> bytes\n\n"
"A serialized SendMessageResponse: top status ``status`` (a serialized Status) and\n"
"one entry per row, each with that status, the row's message id (``ids`` delimited\n"
"by the int32 ``id_offsets``) and its queue offset (``offsets``: int64).");

static PyObject *encode_ok(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer st, ids, ioff, qoff;
    if (!PyArg_ParseTuple(args, "y*y*y*y*", &st, &ids, &ioff, &qoff))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t rows = qoff.len / 8;
    const int32_t *io = ioff.buf;
    const int64_t *qo = qoff.buf;
    if (qoff.len % 8 || ioff.len != (rows + 1) * 4 || (rows && (io[0] < 0 || io[rows] > ids.len))) {
        PyErr_SetString(PyExc_ValueError, "encode_ok: offsets do not match the rows");
        goto done;
    }
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (io[i + 1] < io[i]) {
            PyErr_SetString(PyExc_ValueError, "encode_ok: message id offsets go backwards");
            goto done;
        }
    }
    size_t status_field = 1 + varint_size((uint64_t)st.len) + (size_t)st.len;
    size_t total = status_field;
    for (Py_ssize_t i = 0; i < rows; i++) {
        size_t idn = (size_t)(io[i + 1] - io[i]);
        size_t entry = status_field + 1 + varint_size(idn) + idn + 1 + varint_size((uint64_t)qo[i]);
        total += 1 + varint_size(entry) + entry;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    *p++ = 0x0A;                                  /* status = 1 */
    p = put_varint(p, (uint64_t)st.len);
    memcpy(p, st.buf, (size_t)st.len);
    p += st.len;
    for (Py_ssize_t i = 0; i < rows; i++) {
        size_t idn = (size_t)(io[i + 1] - io[i]);
        size_t entry = status_field + 1 + varint_size(idn) + idn + 1 + varint_size((uint64_t)qo[i]);
        *p++ = 0x12;                              /* entries = 2 */
        p = put_varint(p, entry);
        *p++ = 0x0A;                              /* SendResultEntry.status = 1 */
        p = put_varint(p, (uint64_t)st.len);
        memcpy(p, st.buf, (size_t)st.len);
        p += st.len;
        *p++ = 0x12;                              /* message_id = 2 */
        p = put_varint(p, idn);
        memcpy(p, (const char *)ids.buf + io[i], idn);
        p += idn;
        *p++ = 0x20;                              /* offset = 4 (int64 varint) */
        p = put_varint(p, (uint64_t)qo[i]);
    }
done:
    PyBuffer_Release(&st);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&ioff);
    PyBuffer_Release(&qoff);
    return out;
}

/* A message id of sparkmq's Producer (client/core.py MessageIds) at out: the 20 ASCII
 * bytes of prefix, then the 12 upper-case hex digits of value mod 2**48. */
static void write_id(char *out, const void *prefix, uint64_t value)
{
    static const char hex[] = "0123456789ABCDEF";
    memcpy(out, prefix, 20);
    value &= 0xFFFFFFFFFFFFULL;
    for (int d = 11; d >= 0; d--) {
        out[20 + d] = hex[value & 0xF];
        value >>= 4;
    }
}

PyDoc_STRVAR(encode_plain_doc,
"encode_plain(topic, fields, bodies, prefix, start, born_ms) -> bytes\n\n"
"A serialized SendMessageRequest of len(bodies) plain messages (the client's side of\n"
"``scan_plain``): message i is ``topic`` (its serialized fields before its system\n"
"properties), then its system properties: ``fields`` (those every message shares), the\n"
"born time ``born_ms`` (epoch ms >= 0, a Timestamp of seconds and nanos, each left out\n"
"when 0, as protobuf writes them) and its id: ``prefix`` (20 ASCII bytes) followed by the\n"
"12 upper-case hex digits of (start + i) mod 2**48; then its body, ``bodies[i]`` (bytes).\n"
"sparkmq.client.producer._encode_plain gives the same bytes in Python.");

/* SystemProperties.born_timestamp (7) of epoch ms ``ms``, written at p; its end. */
static uint8_t *put_born(uint8_t *p, uint64_t ms)
{
    uint64_t secs = ms / 1000, nanos = (ms % 1000) * 1000000;
    size_t inner = (secs ? 1 + varint_size(secs) : 0) + (nanos ? 1 + varint_size(nanos) : 0);
    *p++ = 0x3A;
    p = put_varint(p, inner);
    if (secs) {
        *p++ = 0x08;                              /* Timestamp.seconds = 1 */
        p = put_varint(p, secs);
    }
    if (nanos) {
        *p++ = 0x10;                              /* Timestamp.nanos = 2 */
        p = put_varint(p, nanos);
    }
    return p;
}

static PyObject *encode_plain(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer topic, fields, prefix;
    PyObject *bodies, *out = NULL;
    unsigned long long start, born;
    uint8_t born_field[32], *head = NULL;
    if (!PyArg_ParseTuple(args, "y*y*O!y*KK", &topic, &fields, &PyList_Type, &bodies,
                          &prefix, &start, &born))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    size_t born_len = (size_t)(put_born(born_field, born) - born_field);
    size_t sp_len = (size_t)fields.len + born_len + 2 + 32;
    size_t head_len = (size_t)topic.len + 1 + varint_size(sp_len) + (size_t)fields.len
        + born_len + 2;                           /* (the id's key and length: 2) */
    size_t fixed = head_len + 32 + 1, total = 0;
    if (prefix.len != 20) {
        PyErr_SetString(PyExc_ValueError, "encode_plain: the id prefix must be 20 bytes");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i);
        if (!PyBytes_CheckExact(b)) {
            PyErr_Format(PyExc_TypeError, "encode_plain: body %zd is not bytes", i);
            goto done;
        }
        size_t len = (size_t)PyBytes_GET_SIZE(b);
        size_t inner = fixed + varint_size(len) + len;
        total += 1 + varint_size(inner) + inner;
    }
    head = PyMem_Malloc(head_len);
    if (head == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *h = head;
    memcpy(h, topic.buf, (size_t)topic.len);
    h += topic.len;
    *h++ = 0x1A;                                  /* Message.system_properties = 3 */
    h = put_varint(h, sp_len);
    memcpy(h, fields.buf, (size_t)fields.len);
    h += fields.len;
    memcpy(h, born_field, born_len);
    h += born_len;
    *h++ = 0x1A;                                  /* SystemProperties.message_id = 3 */
    *h++ = 0x20;                                  /* (32 bytes) */
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i);
        size_t len = (size_t)PyBytes_GET_SIZE(b);
        *p++ = 0x0A;                              /* SendMessageRequest.messages = 1 */
        p = put_varint(p, fixed + varint_size(len) + len);
        memcpy(p, head, head_len);
        p += head_len;
        write_id((char *)p, prefix.buf, start + (uint64_t)i);
        p += 32;
        *p++ = 0x22;                              /* Message.body = 4 */
        p = put_varint(p, len);
        memcpy(p, PyBytes_AS_STRING(b), len);
        p += len;
    }
done:
    PyMem_Free(head);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&fields);
    PyBuffer_Release(&prefix);
    return out;
}

/* plain_struct: the scan's buffers as one Arrow C struct, pointing into them (held). */
#define PLAIN_COLUMNS 7

typedef struct {
    PyObject *scanned;                          /* the scan's tuple, held */
    struct ArrowArray cols[PLAIN_COLUMNS], key_values;
    struct ArrowArray *children[PLAIN_COLUMNS], *key_children[1];
    const void *buffers[PLAIN_COLUMNS][3], *key_value_buffers[3];
    char topic[];                               /* the topic column: offsets, then data */
} PlainBatch;

static void release_plain(struct ArrowArray *a)
{
    PlainBatch *b = a->private_data;
    a->release = NULL;
    release_held(NULL, 0, b->scanned, b);
}

/* *col as a column of n values over buffers (validity or NULL, then one or two), kept
 * in slots; col. */
static struct ArrowArray *column_over(struct ArrowArray *col, const void **slots, int64_t n,
                                      int64_t nulls, int n_buffers, const void *b0,
                                      const void *b1, const void *b2)
{
    slots[0] = b0;
    slots[1] = b1;
    slots[2] = b2;
    *col = (struct ArrowArray){.length = n, .null_count = nulls, .n_buffers = n_buffers,
                               .buffers = slots, .release = release_child};
    return col;
}

/* cols[k] as a column (column_over), the batch's child k */
static struct ArrowArray *plain_column(PlainBatch *b, int k, int64_t n, int64_t nulls,
                                       int n_buffers, const void *b0, const void *b1,
                                       const void *b2)
{
    return b->children[k] = column_over(&b->cols[k], b->buffers[k], n, nulls, n_buffers,
                                        b0, b1, b2);
}

PyDoc_STRVAR(plain_struct_doc,
"plain_struct(scanned, tags, keys) -> capsule\n\n"
"scan_plain's tuple as a record batch exported to the Arrow C data interface (an\n"
"\"arrow_array\" capsule; no copy of its buffers, which it holds): topic, body,\n"
"unique_key, born_timestamp, born_host, then tags if tags is true and keys if keys is\n"
"true (the caller's schema says which), typed string, binary, string, timestamp (ms),\n"
"string, string and list<string>. ValueError where the tuple's buffers do not fit its\n"
"row count.");

static PyObject *plain_struct(PyObject *self, PyObject *args)
{
    PyObject *scanned;
    int want_tags, want_keys;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!pp", &PyTuple_Type, &scanned, &want_tags, &want_keys))
        return NULL;
    PyObject *topic, *bodies, *body_off, *ids, *id_off, *hosts, *host_off, *borns;
    PyObject *tag_bits, *tag_off, *tags, *key_bits, *key_lists, *key_off, *keys;
    Py_ssize_t n, tag_nulls, key_nulls;
    /* scan_plain's 18 items, read in place (a format string's parse of them cost more
       than the rest of this call): bytes, but n, tag_nulls and key_nulls (ints) */
    PyObject **item[18] = {&topic, NULL, &bodies, &body_off, &ids, &id_off, &hosts,
                           &host_off, &borns, &tag_bits, NULL, &tag_off, &tags, &key_bits,
                           NULL, &key_lists, &key_off, &keys};
    Py_ssize_t *count[18] = {[1] = &n, [10] = &tag_nulls, [14] = &key_nulls};
    if (PyTuple_GET_SIZE(scanned) != 18) {
        PyErr_SetString(PyExc_TypeError, "plain_struct: not a tuple scan_plain gave");
        return NULL;
    }
    for (int i = 0; i < 18; i++) {
        PyObject *o = PyTuple_GET_ITEM(scanned, i);
        if (item[i] && PyBytes_Check(o)) {
            *item[i] = o;
        } else if (!item[i] && PyLong_Check(o)) {
            *count[i] = PyLong_AsSsize_t(o);
            if (*count[i] == -1 && PyErr_Occurred())
                return NULL;
        } else {
            PyErr_Format(PyExc_TypeError, "plain_struct: item %d of the scanned tuple is "
                         "%.80s, not %s", i, Py_TYPE(o)->tp_name, item[i] ? "bytes" : "an int");
            return NULL;
        }
    }
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic), offsets = (n + 1) * 4;
    Py_ssize_t key_values = PyBytes_GET_SIZE(key_off) / 4 - 1;
    if (n <= 0 || topic_len * n > INT32_MAX || PyBytes_GET_SIZE(body_off) != offsets
            || PyBytes_GET_SIZE(id_off) != offsets || PyBytes_GET_SIZE(host_off) != offsets
            || PyBytes_GET_SIZE(tag_off) != offsets || PyBytes_GET_SIZE(key_lists) != offsets
            || PyBytes_GET_SIZE(borns) != n * 8 || key_values < 0
            || PyBytes_GET_SIZE(tag_bits) < (n + 7) / 8
            || PyBytes_GET_SIZE(key_bits) < (n + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "plain_struct: not a tuple scan_plain gave");
        return NULL;
    }
    PlainBatch *b = PyMem_RawCalloc(1, sizeof(PlainBatch) + (size_t)offsets
                                    + (size_t)(topic_len * n));
    if (!b)
        return PyErr_NoMemory();
    int32_t *topic_offsets = (int32_t *)b->topic;
    char *topic_data = b->topic + offsets;
    for (Py_ssize_t i = 0; i <= n; i++)
        topic_offsets[i] = (int32_t)(i * topic_len);
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy(topic_data + i * topic_len, PyBytes_AS_STRING(topic), (size_t)topic_len);
    int k = 0;
    plain_column(b, k++, n, 0, 3, NULL, topic_offsets, topic_data);
    plain_column(b, k++, n, 0, 3, NULL, PyBytes_AS_STRING(body_off), PyBytes_AS_STRING(bodies));
    plain_column(b, k++, n, 0, 3, NULL, PyBytes_AS_STRING(id_off), PyBytes_AS_STRING(ids));
    plain_column(b, k++, n, 0, 2, NULL, PyBytes_AS_STRING(borns), NULL);
    plain_column(b, k++, n, 0, 3, NULL, PyBytes_AS_STRING(host_off), PyBytes_AS_STRING(hosts));
    if (want_tags)
        plain_column(b, k++, n, tag_nulls, 3, tag_nulls ? PyBytes_AS_STRING(tag_bits) : NULL,
                     PyBytes_AS_STRING(tag_off), PyBytes_AS_STRING(tags));
    if (want_keys) {
        struct ArrowArray *list = plain_column(
            b, k++, n, key_nulls, 2, key_nulls ? PyBytes_AS_STRING(key_bits) : NULL,
            PyBytes_AS_STRING(key_lists), NULL);
        b->key_value_buffers[1] = PyBytes_AS_STRING(key_off);
        b->key_value_buffers[2] = PyBytes_AS_STRING(keys);
        b->key_values = (struct ArrowArray){.length = key_values, .n_buffers = 3,
                                            .buffers = b->key_value_buffers,
                                            .release = release_child};
        b->key_children[0] = &b->key_values;
        list->n_children = 1;
        list->children = b->key_children;
    }
    struct ArrowArray *a;
    PyObject *capsule = struct_capsule(n, k, b->children, release_plain, b, &a);
    if (!capsule) {
        PyMem_RawFree(b);
        return NULL;
    }
    Py_INCREF(scanned);
    b->scanned = scanned;
    return capsule;
}

/* send_struct: a Flight DoPut batch of plain messages made from their bodies (the client's
 * side, as encode_plain is for SendMessage), every value copied into one block. */
#define SEND_COLUMNS 6

typedef struct {
    struct ArrowArray cols[SEND_COLUMNS];
    struct ArrowArray *children[SEND_COLUMNS];
    const void *buffers[SEND_COLUMNS][3];
    char data[];                                /* each column's buffers, 8-byte aligned */
} SendBatch;

static void release_send(struct ArrowArray *a)
{
    void *b = a->private_data;
    a->release = NULL;
    PyMem_RawFree(b);                           /* (no Python object held: no GIL needed) */
}

static size_t up8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

static void send_column(SendBatch *b, int k, int64_t n, int64_t nulls, int n_buffers,
                        const void *b0, const void *b1, const void *b2)
{
    b->children[k] = column_over(&b->cols[k], b->buffers[k], n, nulls, n_buffers, b0, b1, b2);
}

/* Column k: n times the len bytes at value, a string column laid out at p; the end. */
static char *repeated(SendBatch *b, int k, Py_ssize_t n, const char *value, Py_ssize_t len,
                      char *p)
{
    int32_t *offsets = (int32_t *)p;
    char *data = p + up8((size_t)(n + 1) * 4);
    for (Py_ssize_t i = 0; i <= n; i++)
        offsets[i] = (int32_t)(i * len);
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy(data + i * len, value, (size_t)len);
    send_column(b, k, n, 0, 3, NULL, offsets, data);
    return data + up8((size_t)(n * len));
}

PyDoc_STRVAR(send_struct_doc,
"send_struct(topic, group, host, bodies, prefix, start, born_ms) -> (capsule, address)\n\n"
"A Flight DoPut batch of len(bodies) plain messages exported to the Arrow C data interface\n"
"(an \"arrow_array\" capsule owning a copy of every value, and the address of its struct\n"
"for pyarrow's import, which moves it out; the capsule frees what is left), in the columns of\n"
"sparkmq.client.flight.PLAIN_SEND_SCHEMA: topic, body, message_group, unique_key,\n"
"born_timestamp, born_host. ``topic``, ``group`` and ``host`` are UTF-8 bytes repeated on\n"
"every row (``group`` None: null), ``bodies`` a list of bytes, message i's id ``prefix``\n"
"(20 ASCII bytes) and the 12 upper-case hex digits of (start + i) mod 2**48 (as\n"
"encode_plain writes it), every born time ``born_ms``. ValueError where a column would\n"
"pass 2 GiB.");

static PyObject *send_struct(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer topic, host, prefix, group = {0};
    PyObject *group_obj, *bodies, *capsule = NULL;
    unsigned long long start;
    long long born;
    SendBatch *b = NULL;
    if (!PyArg_ParseTuple(args, "y*Oy*O!y*KL", &topic, &group_obj, &host, &PyList_Type,
                          &bodies, &prefix, &start, &born))
        return NULL;
    int has_group = group_obj != Py_None;
    if (has_group && PyObject_GetBuffer(group_obj, &group, PyBUF_SIMPLE) < 0) {
        has_group = 0;
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (prefix.len != 20 || n <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "send_struct: the id prefix must be 20 bytes, and a body given");
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        if (!PyBytes_CheckExact(body)) {
            PyErr_Format(PyExc_TypeError, "send_struct: body %zd is not bytes", i);
            goto done;
        }
        total += (size_t)PyBytes_GET_SIZE(body);
    }
    Py_ssize_t longest = topic.len > host.len ? topic.len : host.len;
    if (has_group && group.len > longest)
        longest = group.len;
    if (longest < 32)
        longest = 32;                                       /* (the ids) */
    if (total > INT32_MAX || (size_t)longest * (size_t)n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "send_struct: a column would pass 2 GiB");
        goto done;
    }
    size_t offsets = up8((size_t)(n + 1) * 4), un = (size_t)n;
    size_t size = offsets + up8(un * (size_t)topic.len)            /* topic */
        + offsets + up8(total)                                     /* body */
        + (has_group ? offsets + up8(un * (size_t)group.len)
                     : up8((un + 7) / 8) + offsets)                /* message_group */
        + offsets + up8(un * 32)                                   /* unique_key */
        + un * 8                                                   /* born_timestamp */
        + offsets + up8(un * (size_t)host.len);                    /* born_host */
    b = PyMem_RawCalloc(1, sizeof(SendBatch) + size);
    if (!b) {
        PyErr_NoMemory();
        goto done;
    }
    char *p = repeated(b, 0, n, topic.buf, topic.len, b->data);
    int32_t *body_offsets = (int32_t *)p;
    char *body_data = p + offsets;
    int32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        Py_ssize_t len = PyBytes_GET_SIZE(body);
        body_offsets[i] = at;
        memcpy(body_data + at, PyBytes_AS_STRING(body), (size_t)len);
        at += (int32_t)len;
    }
    body_offsets[n] = at;
    send_column(b, 1, n, 0, 3, NULL, body_offsets, body_data);
    p = body_data + up8(total);
    if (has_group) {
        p = repeated(b, 2, n, group.buf, group.len, p);
    } else {            /* every row null: its validity bits and offsets all zero */
        char *bits = p, *zeros = p + up8((un + 7) / 8);
        send_column(b, 2, n, n, 3, bits, zeros, zeros);
        p = zeros + offsets;
    }
    int32_t *id_offsets = (int32_t *)p;
    char *ids = p + offsets;
    for (Py_ssize_t i = 0; i <= n; i++)
        id_offsets[i] = (int32_t)(i * 32);
    for (Py_ssize_t i = 0; i < n; i++)
        write_id(ids + i * 32, prefix.buf, start + (uint64_t)i);
    send_column(b, 3, n, 0, 3, NULL, id_offsets, ids);
    int64_t *borns = (int64_t *)(ids + up8(un * 32));
    for (Py_ssize_t i = 0; i < n; i++)
        borns[i] = born;
    send_column(b, 4, n, 0, 2, NULL, borns, NULL);
    repeated(b, 5, n, host.buf, host.len, (char *)(borns + n));
    struct ArrowArray *a = NULL;
    capsule = struct_capsule(n, SEND_COLUMNS, b->children, release_send, b, &a);
    if (capsule) {
        b = NULL;                                   /* (the capsule's now) */
        capsule = capsule_and_address(capsule, a);
    }
done:
    PyMem_RawFree(b);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&host);
    PyBuffer_Release(&prefix);
    if (has_group)
        PyBuffer_Release(&group);
    return capsule;
}

static PyMethodDef methods[] = {
    {"scan_plain", (PyCFunction)(void (*)(void))scan_plain, METH_FASTCALL, scan_plain_doc},
    {"plain_struct", plain_struct, METH_VARARGS, plain_struct_doc},
    {"encode_ok", encode_ok, METH_VARARGS, encode_ok_doc},
    {"encode_plain", encode_plain, METH_VARARGS, encode_plain_doc},
    {"send_struct", send_struct, METH_VARARGS, send_struct_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sparkmq._wire",
    "The plain SendMessage request and its answer without a Python object per message.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__wire(void)
{
    return PyModule_Create(&module);
}
