#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static int buf_reserve(moe_buf_t *b, size_t extra) {
    if (b->failed)
        return -1;
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

void moe_buf_append(moe_buf_t *b, const char *s, size_t n) {
    if (buf_reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

char *moe_buf_extend(moe_buf_t *b, size_t n) {
    if (buf_reserve(b, n))
        return NULL;
    char *p = b->data + b->len;
    b->len += n;
    b->data[b->len] = '\0';
    return p;
}

void moe_buf_vprintf(moe_buf_t *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0 || buf_reserve(b, (size_t)n))
        return;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void moe_buf_printf(moe_buf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    moe_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void moe_buf_free(moe_buf_t *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

char *moe_read_regular(const char *path, size_t max, size_t *len, int flags, char *err, size_t errlen) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is then
     * refused as not a regular file) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (flags & MOE_READ_NOFOLLOW ? O_NOFOLLOW : 0));
    if (fd < 0) {
        snprintf(err, errlen, "cannot open '%s': %s", path,
                 errno == ELOOP && (flags & MOE_READ_NOFOLLOW) ? "a symbolic link, not followed" : strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((unsigned long long)st.st_size > max) {
        snprintf(err, errlen, "'%s' is larger than %zu bytes", path, max);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    moe_buf_t b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b.len + n > max) { /* grew since the fstat */
            snprintf(err, errlen, "'%s' is larger than %zu bytes", path, max);
            fclose(f);
            moe_buf_free(&b);
            return NULL;
        }
        moe_buf_append(&b, chunk, n);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || b.failed) {
        snprintf(err, errlen, "cannot read '%s'", path);
        moe_buf_free(&b);
        return NULL;
    }
    if (!b.data)
        moe_buf_append(&b, "", 0);
    if (len)
        *len = b.len;
    return b.data;
}

char *moe_read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen) {
    return moe_read_regular(path, max, len, 0, err, errlen);
}

int moe_mkdirs(const char *path, char *err, size_t errlen) {
    char buf[4096];
    if (!path[0]) { /* the walk below starts after the first character */
        snprintf(err, errlen, "the folder name is empty");
        return -1;
    }
    if (strlen(path) >= sizeof buf) {
        snprintf(err, errlen, "path too long: '%s'", path);
        return -1;
    }
    strcpy(buf, path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                snprintf(err, errlen, "cannot create folder '%s': %s", buf, strerror(errno));
                return -1;
            }
            *p = c;
            if (!c)
                break;
        }
    }
    return 0;
}

void moe_hash_hex(const void *data, size_t n, char out[33]) {
    XXH128_hash_t h = XXH3_128bits(data, n);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

FILE *moe_create_temp(const char *path, char *tmp, size_t tmplen, unsigned mode) {
    static unsigned counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int attempt = 0; attempt < 64; attempt++) {
        unsigned long long r = (unsigned long long)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^
                               (unsigned long long)getpid() << 20 ^ __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
        if ((size_t)snprintf(tmp, tmplen, "%s.tmp.%ld.%012llx", path, (long)getpid(), r & 0xffffffffffffULL) >= tmplen) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
        if (fd >= 0) {
            FILE *f = fdopen(fd, "wb");
            if (!f) {
                int e = errno;
                close(fd);
                unlink(tmp);
                errno = e;
            }
            return f;
        }
        if (errno != EEXIST)
            return NULL;
        ts.tv_nsec += 7919 * (attempt + 1);
    }
    errno = EEXIST;
    return NULL;
}
