/* The Arrow C data interface's two structs (arrow.apache.org/docs/format/CDataInterface.html),
 * as pyarrow exports a record batch through RecordBatch.__arrow_c_array__(): capsules named
 * "arrow_schema" and "arrow_array". Shared by sparkmq/_ipc.c, _screen.c, _compose.c and
 * _wire.c. */
#ifndef SPARKMQ_ARROW_C_H
#define SPARKMQ_ARROW_C_H
#include <stdint.h>

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#endif
