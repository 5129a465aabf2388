/* cache.c — the on-disk cubin cache. */
#define _POSIX_C_SOURCE 200809L
#include "cache.h"

#include "compile.h"
#include "emit.h"
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define ENTRY_MAGIC "MOEGENC2"
#define ENTRY_HEADER 32 /* magic 8, hash 16 (of the key and the payload), length 8 */

void moe_cache_dir(char *out, size_t n) {
    const char *d = getenv("MOEGEN_CACHE_DIR");
    if (d && *d) {
        snprintf(out, n, "%s", d);
        return;
    }
    d = getenv("XDG_CACHE_HOME");
    if (d && *d) {
        snprintf(out, n, "%s/moegen", d);
        return;
    }
    d = getenv("HOME");
    if (d && *d) {
        snprintf(out, n, "%s/.cache/moegen", d);
        return;
    }
    out[0] = '\0';
}

int moe_cache_key(const moe_plan_desc_t *pd, const char *templates_dir, moe_arch_t arch, char key[33],
                  moe_diag_t *diag) {
    moe_tmpl_t *t = moe_tmpl_open(templates_dir);
    char th[33];
    if (!t || moe_tmpl_content_hash(t, th)) {
        moe_tmpl_close(t);
        snprintf(diag->msg, sizeof diag->msg, "moegen: error: cannot read the templates to hash them");
        return 1;
    }
    moe_tmpl_close(t);
    /* the source itself: C code that feeds the templates (the planner, the
     * headers emission pastes in) changes kernels without touching the
     * templates, the spec or the names */
    moe_buf_t src = {0};
    if (moe_emit_source(pd, templates_dir, &src, diag)) {
        moe_buf_free(&src);
        return 1;
    }
    char sh[33];
    moe_hash_hex(src.data, src.len, sh);
    moe_buf_free(&src);
    char nv[32];
    moe_nvrtc_version(nv, sizeof nv);
    moe_buf_t b = {0};
    moe_buf_printf(&b, "spec=%s\ngenerator=%s\ntemplates=%s\nsource=%s\nnvrtc=%s\narch=%s\noptions=%s\n",
                   pd->spec.hash, MOEGEN_VERSION, th, sh, nv, moe_arch_name(arch), moe_nvrtc_options());
    /* the kernel names spell every tile parameter, which the tuning table
     * (not the spec) may change: a different table must not reuse a cubin */
    const moe_kernel_desc_t *ks = moe_plan_kernels(pd, arch);
    for (int i = 0; i < MOE_K_COUNT; i++)
        moe_buf_printf(&b, "kernel=%s\n", ks[i].name);
    for (int v = 0; pd->nvariants > 1 && v < pd->nvariants; v++) /* every GEMM variant's (gen/plan.h) */
        for (int i = 0; i < MOE_K_COUNT; i++)
            moe_buf_printf(&b, "variant%d=%s\n", v, pd->variants[v].kernels[arch][i].name);
    if (b.failed) {
        moe_buf_free(&b);
        snprintf(diag->msg, sizeof diag->msg, "moegen: error: out of memory");
        return 1;
    }
    moe_hash_hex(b.data, b.len, key);
    moe_buf_free(&b);
    return 0;
}

/* XXH3-128 of the key and the payload: an entry is valid only under the
 * name of the key it was written for. */
static XXH128_hash_t entry_hash(const char *key, const char *data, size_t n) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, key, strlen(key));
    XXH3_128bits_update(&st, data, n);
    return XXH3_128bits_digest(&st);
}

/* A valid entry's payload, or -1 (missing, a link, not a regular file,
 * short, bad magic, a hash that is not of this key and payload). */
static int entry_read(const char *path, const char *key, moe_buf_t *cubin) {
    size_t len;
    char err[256];
    char *data = moe_read_regular(path, 1u << 30, &len, MOE_READ_NOFOLLOW, err, sizeof err);
    if (!data)
        return -1;
    int ok = len >= ENTRY_HEADER && memcmp(data, ENTRY_MAGIC, 8) == 0;
    uint64_t n = 0;
    if (ok) {
        memcpy(&n, data + 24, 8);
        ok = n == len - ENTRY_HEADER;
    }
    if (ok) {
        XXH128_hash_t h = entry_hash(key, data + ENTRY_HEADER, (size_t)n);
        ok = memcmp(&h.high64, data + 8, 8) == 0 && memcmp(&h.low64, data + 16, 8) == 0;
    }
    if (ok)
        moe_buf_append(cubin, data + ENTRY_HEADER, (size_t)n);
    free(data);
    return ok && !cubin->failed ? 0 : -1;
}

static void entry_write(const char *path, const char *key, const moe_buf_t *cubin) {
    char tmp[4200];
    FILE *f = moe_create_temp(path, tmp, sizeof tmp, 0600); /* the cache is private to its user */
    if (!f)
        return;
    unsigned char header[ENTRY_HEADER];
    memcpy(header, ENTRY_MAGIC, 8);
    XXH128_hash_t h = entry_hash(key, cubin->data, cubin->len);
    memcpy(header + 8, &h.high64, 8);
    memcpy(header + 16, &h.low64, 8);
    uint64_t n = cubin->len;
    memcpy(header + 24, &n, 8);
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    ok = ok && fwrite(cubin->data, 1, cubin->len, f) == cubin->len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

/* The cache folder, private to this user: created 0700 (its parents as
 * mkdir -p makes them), then opened without following a link and checked
 * to be a folder owned by this user that no one else may write (else
 * another user could plant a cubin that this process runs). Returns 1
 * usable, 0 when it cannot be created (the compile goes on without the
 * cache), -1 refused with diag set. Trailing slashes are dropped from dir
 * (a path ending in '/' would follow a link). */
static int cache_dir_private(char *dir, moe_diag_t *diag) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = '\0';
    char *slash = strrchr(dir, '/'), err[256];
    if (slash && slash != dir) {
        *slash = '\0';
        int bad = moe_mkdirs(dir, err, sizeof err);
        *slash = '/';
        if (bad)
            return 0;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode)) {
            snprintf(diag->msg, sizeof diag->msg, "moegen: error: the cache folder '%s' is a symbolic link, which "
                     "moegen does not follow (another user could point it at their cubins); set MOEGEN_CACHE_DIR "
                     "to a private folder", dir);
            return -1;
        }
        if (errno == ENOTDIR) {
            snprintf(diag->msg, sizeof diag->msg, "moegen: error: the cache folder '%s' is not a folder; set "
                     "MOEGEN_CACHE_DIR to a private folder", dir);
            return -1;
        }
        return 0;
    }
    int ok = fstat(fd, &st) == 0;
    close(fd);
    if (!ok)
        return 0;
    if (st.st_uid != geteuid()) {
        snprintf(diag->msg, sizeof diag->msg, "moegen: error: the cache folder '%s' belongs to user %ld, not to this "
                 "user (%ld): its cubins would run in this process; set MOEGEN_CACHE_DIR to a folder of your own",
                 dir, (long)st.st_uid, (long)geteuid());
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(diag->msg, sizeof diag->msg, "moegen: error: the cache folder '%s' is writable by other users "
                 "(mode %04o): a cubin planted there would run in this process; make it private (chmod 700 '%s') "
                 "or set MOEGEN_CACHE_DIR to a private folder", dir, (unsigned)(st.st_mode & 07777), dir);
        return -1;
    }
    return 1;
}

int moe_cache_cubin(const moe_plan_desc_t *pd, const char *templates_dir, moe_arch_t arch, const char *cache_dir,
                    moe_buf_t *cubin, int *hit, moe_diag_t *diag) {
    char dir[4096], key[33], path[4200];
    *hit = 0;
    if (cache_dir)
        snprintf(dir, sizeof dir, "%s", cache_dir);
    else
        moe_cache_dir(dir, sizeof dir);
    if (moe_cache_key(pd, templates_dir, arch, key, diag))
        return 1;
    int use = dir[0] ? cache_dir_private(dir, diag) : 0;
    if (use < 0)
        return 1;
    if (use) {
        snprintf(path, sizeof path, "%s/%s-%s.cubin", dir, pd->spec.name, key);
        if (entry_read(path, key, cubin) == 0) {
            *hit = 1;
            return 0;
        }
        cubin->len = 0;
        cubin->failed = 0;
    }
    moe_buf_t src = {0};
    if (moe_emit_source(pd, templates_dir, &src, diag)) {
        moe_buf_free(&src);
        return 1;
    }
    char name[128];
    snprintf(name, sizeof name, "%s.cu", pd->spec.name);
    int rc = moe_nvrtc_compile(src.data, name, arch, cubin, NULL, NULL, diag);
    moe_buf_free(&src);
    if (rc)
        return 1;
    if (use)
        entry_write(path, key, cubin);
    return 0;
}
