/* util.h — small helpers shared by the generator: a growable text buffer,
 * whole-file reads, the hash's hex form, mkdir -p. (All-or-nothing writes of a set of files are
 * moe_fileset_write in emit.h.) */
#ifndef MOEGEN_UTIL_H
#define MOEGEN_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    char *data;   /* NUL-terminated; owned */
    size_t len, cap;
    int failed;   /* an allocation failed; data is incomplete */
} moe_buf_t;

void moe_buf_printf(moe_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void moe_buf_vprintf(moe_buf_t *b, const char *fmt, va_list ap);
void moe_buf_append(moe_buf_t *b, const char *s, size_t n);
void moe_buf_free(moe_buf_t *b);
/* Grow b by n bytes (then NUL) and return a pointer to them, or NULL. */
char *moe_buf_extend(moe_buf_t *b, size_t n);

/* Read a whole regular file (at most max bytes) into a NUL-terminated
 * malloc'd buffer. A FIFO, a device (/dev/zero), a folder or a file over
 * max is refused without waiting or reading it. On error returns NULL with
 * a reason in err. */
char *moe_read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen);

/* moe_read_file with flags: MOE_READ_NOFOLLOW refuses a symbolic link as
 * the last component (the JIT cache's entries). */
#define MOE_READ_NOFOLLOW 1
char *moe_read_regular(const char *path, size_t max, size_t *len, int flags, char *err, size_t errlen);

/* XXH3-128 of n bytes at data as 32 lowercase hex digits (high word
 * first) and a NUL: the one spelling of the spec hash, the templates hash
 * and the cache key. */
void moe_hash_hex(const void *data, size_t n, char out[33]);

/* Create a new temporary file beside `path` (`path` + ".tmp." + a unique
 * suffix, written to tmp) with O_CREAT|O_EXCL|O_NOFOLLOW and `mode` (less
 * the umask), so a file or link planted at a guessable name is never
 * opened or followed. Returns the file open for writing, or NULL with errno
 * set. The caller renames tmp over path (or unlinks it). */
FILE *moe_create_temp(const char *path, char *tmp, size_t tmplen, unsigned mode);

/* mkdir -p. Returns 0, or -1 with a reason in err. */
int moe_mkdirs(const char *path, char *err, size_t errlen);

#endif
