/* cache.c — the on-disk cubin cache. */
#define _POSIX_C_SOURCE 200809L
#include "cache.h"

#include "compile.h"
#include "emit.h"
#include "template.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define ENTRY_MAGIC "MOEGENC1"
#define ENTRY_HEADER 32 /* magic 8, hash 16, length 8 */

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
    char nv[32];
    moe_nvrtc_version(nv, sizeof nv);
    moe_buf_t b = {0};
    moe_buf_printf(&b, "spec=%s\ngenerator=%s\ntemplates=%s\nnvrtc=%s\narch=%s\noptions=%s\n", pd->spec.hash,
                   MOEGEN_VERSION, th, nv, moe_arch_name(arch), moe_nvrtc_options());
    /* the kernel names spell every tile parameter, which the tuning table
     * (not the spec) may change: a different table must not reuse a cubin */
    const moe_kernel_desc_t *ks = moe_plan_kernels(pd, arch);
    for (int i = 0; i < MOE_K_COUNT; i++)
        moe_buf_printf(&b, "kernel=%s\n", ks[i].name);
    if (b.failed) {
        moe_buf_free(&b);
        snprintf(diag->msg, sizeof diag->msg, "moegen: error: out of memory");
        return 1;
    }
    moe_hash_hex(b.data, b.len, key);
    moe_buf_free(&b);
    return 0;
}

/* A valid entry's payload, or -1 (missing, short, bad magic, bad hash). */
static int entry_read(const char *path, moe_buf_t *cubin) {
    size_t len;
    char err[256];
    char *data = moe_read_file(path, 1u << 30, &len, err, sizeof err);
    if (!data)
        return -1;
    int ok = len >= ENTRY_HEADER && memcmp(data, ENTRY_MAGIC, 8) == 0;
    uint64_t n = 0;
    if (ok) {
        memcpy(&n, data + 24, 8);
        ok = n == len - ENTRY_HEADER;
    }
    if (ok) {
        XXH128_hash_t h = XXH3_128bits(data + ENTRY_HEADER, (size_t)n);
        ok = memcmp(&h.high64, data + 8, 8) == 0 && memcmp(&h.low64, data + 16, 8) == 0;
    }
    if (ok)
        moe_buf_append(cubin, data + ENTRY_HEADER, (size_t)n);
    free(data);
    return ok && !cubin->failed ? 0 : -1;
}

static void entry_write(const char *dir, const char *path, const moe_buf_t *cubin) {
    char err[256];
    if (moe_mkdirs(dir, err, sizeof err))
        return;
    char tmp[4200];
    FILE *f = moe_create_temp(path, tmp, sizeof tmp, 0600); /* the cache is private to its user */
    if (!f)
        return;
    unsigned char header[ENTRY_HEADER];
    memcpy(header, ENTRY_MAGIC, 8);
    XXH128_hash_t h = XXH3_128bits(cubin->data, cubin->len);
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
    if (dir[0]) {
        snprintf(path, sizeof path, "%s/%s-%s.cubin", dir, pd->spec.name, key);
        if (entry_read(path, cubin) == 0) {
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
    if (dir[0])
        entry_write(dir, path, cubin);
    return 0;
}
