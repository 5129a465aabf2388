/* test_cache.c — the JIT disk cache: where it lives (MOEGEN_CACHE_DIR,
 * XDG_CACHE_HOME, HOME), miss then hit, corrupt entries read as misses and
 * are rebuilt, two processes racing on one key, and the key (arch, spec,
 * template content, helpers imported from a --templates folder). The cases
 * run once on a copy of templates/ whose prelude and kernel templates are all
 * stubs (fast compiles: they test the cache, not the kernels) and once more on
 * the embedded templates. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include "gen_fixture.h"

#include "cache.h"

/* ---- the JIT cache ------------------------------------------------------------------ */

/* Set or unset (v == NULL) an environment variable. */
static void env(const char *k, const char *v) {
    if (v)
        setenv(k, v, 1);
    else
        unsetenv(k);
}

static void test_cache_dir(void) {
    CASE("cache dir: MOEGEN_CACHE_DIR, then XDG_CACHE_HOME, then HOME");
    char *saved[3];
    static const char *const vars[3] = {"MOEGEN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    for (int i = 0; i < 3; i++)
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
    char dir[512];
    env("MOEGEN_CACHE_DIR", "/c/moegen_dir");
    env("XDG_CACHE_HOME", "/c/xdg");
    env("HOME", "/c/home");
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/moegen_dir");
    env("MOEGEN_CACHE_DIR", "");
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/xdg/moegen");
    env("MOEGEN_CACHE_DIR", NULL);
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/xdg/moegen");
    env("XDG_CACHE_HOME", NULL);
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/home/.cache/moegen");
    env("HOME", NULL);
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "");
    for (int i = 0; i < 3; i++) {
        env(vars[i], saved[i]);
        free(saved[i]);
    }
}

/* Files in dir: total and temporaries (names with ".tmp"). */
static void count_entries(const char *dir, int *total, int *temps) {
    static char names[64][256];
    int n = list_dir(dir, names, 64);
    *total = n;
    *temps = 0;
    for (int i = 0; i < n; i++)
        *temps += strstr(names[i], ".tmp") != NULL;
}

static int same_buf(const moe_buf_t *a, const moe_buf_t *b) {
    return a->len == b->len && a->len > 0 && memcmp(a->data, b->data, a->len) == 0;
}

/* Call moe_cache_cubin; *hit and out filled. Returns rc. */
static int cache_get(const moe_plan_desc_t *pd, const char *tdir, const char *cdir, moe_buf_t *out, int *hit) {
    moe_diag_t d;
    out->len = 0;
    int rc = moe_cache_cubin(pd, tdir, MOE_ARCH_SM90A, cdir, out, hit, &d);
    if (rc)
        fprintf(stderr, "  moe_cache_cubin: %s\n", d.msg);
    return rc;
}

/* Miss, hit, corruption and a race, with templates from tdir. */
static void cache_behaviour(const char *what, const char *tdir) {
    char label[300], cdir[300], entry[700], key[33];
    moe_plan_desc_t pd;
    moe_diag_t d;
    snprintf(label, sizeof label, "cache (%s): first call is a miss", what);
    CASE(label);
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    snprintf(cdir, sizeof cdir, "%s/cache_%s", tmp_root, what);
    CHECKF(moe_cache_key(&pd, tdir, MOE_ARCH_SM90A, key, &d) == 0, "%s", d.msg);
    snprintf(entry, sizeof entry, "%s/%s-%s.cubin", cdir, pd.spec.name, key);
    moe_buf_t first = {0}, b = {0};
    int hit = -1, total, temps;
    CHECK(cache_get(&pd, tdir, cdir, &first, &hit) == 0);
    CHECK(hit == 0 && first.len > 0);
    count_entries(cdir, &total, &temps);
    CHECKF(total == 1 && temps == 0, "%d files, %d temporaries", total, temps);
    CHECKF(exists(entry), "no entry %s", entry);

    snprintf(label, sizeof label, "cache (%s): second call is a hit", what);
    CASE(label);
    CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
    CHECK(hit == 1);
    CHECK(same_buf(&b, &first));

    /* corruptions: each must read as a miss, rebuild, and leave a valid entry */
    static const char *const kinds[] = {"a flipped payload byte", "a flipped header byte", "a truncated payload",
                                        "a file shorter than its header", "an empty file", "bad magic"};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        snprintf(label, sizeof label, "cache (%s): %s is a miss and is rebuilt", what, kinds[k]);
        CASE(label);
        size_t len;
        char *data = read_bytes(entry, &len);
        CHECK(data != NULL && len > 64);
        if (!data || len <= 64) {
            free(data);
            continue;
        }
        switch (k) {
        case 0: data[32 + (len - 32) / 2] ^= 0x40; break;
        case 1: data[12] ^= 0x01; break;
        case 2: len = 32 + (len - 32) / 2; break;
        case 3: len = 20; break;
        case 4: len = 0; break;
        default: data[0] = 'X'; break;
        }
        CHECK(write_bytes(entry, data, len) == 0);
        free(data);
        CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
        CHECKF(hit == 0, "a corrupt entry was used");
        CHECK(same_buf(&b, &first));
        CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
        CHECKF(hit == 1, "the rebuilt entry is not valid");
        CHECK(same_buf(&b, &first));
        count_entries(cdir, &total, &temps);
        CHECKF(total == 1 && temps == 0, "%d files, %d temporaries", total, temps);
    }

    /* two processes compiling the same key at once */
    for (int round = 0; round < 2; round++) {
        snprintf(label, sizeof label, "cache (%s): two processes at once, round %d", what, round + 1);
        CASE(label);
        char rdir[300];
        snprintf(rdir, sizeof rdir, "%s/race_%s_%d", tmp_root, what, round);
        int go[2];
        CHECK(pipe(go) == 0);
        pid_t kid[2];
        fflush(NULL);
        for (int i = 0; i < 2; i++) {
            kid[i] = fork();
            if (kid[i] == 0) {
                close(go[1]);
                char c;
                if (read(go[0], &c, 1) != 1)
                    _exit(4);
                moe_buf_t cb = {0};
                int h = -1;
                moe_diag_t dd;
                int rc = moe_cache_cubin(&pd, tdir, MOE_ARCH_SM90A, rdir, &cb, &h, &dd);
                char p[600];
                snprintf(p, sizeof p, "%s/race_%s_%d_%d.bin", tmp_root, what, round, i);
                /* usually both miss and compile at once; a process that
                 * starts late may find the other's entry, which is fine */
                _exit(rc == 0 && write_bytes(p, cb.data, cb.len) == 0 ? 0 : 6);
            }
        }
        close(go[0]);
        CHECK(write(go[1], "gg", 2) == 2);
        close(go[1]);
        for (int i = 0; i < 2; i++) {
            int st = 0;
            waitpid(kid[i], &st, 0);
            CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d: status %d", i, st);
        }
        moe_buf_t r[2] = {{0}, {0}};
        for (int i = 0; i < 2; i++) {
            char p[600];
            snprintf(p, sizeof p, "%s/race_%s_%d_%d.bin", tmp_root, what, round, i);
            size_t l;
            char *data = read_bytes(p, &l);
            if (data)
                moe_buf_append(&r[i], data, l);
            free(data);
        }
        CHECK(same_buf(&r[0], &first) && same_buf(&r[1], &first));
        count_entries(rdir, &total, &temps);
        CHECKF(total == 1 && temps == 0, "%d files, %d temporaries", total, temps);
        CHECK(cache_get(&pd, tdir, rdir, &b, &hit) == 0);
        CHECKF(hit == 1, "the entry left by the race is not valid");
        CHECK(same_buf(&b, &first));
        moe_buf_free(&r[0]);
        moe_buf_free(&r[1]);
    }

    snprintf(label, sizeof label, "cache (%s): MOEGEN_CACHE_DIR names the folder", what);
    CASE(label);
    char edir[300];
    snprintf(edir, sizeof edir, "%s/cache_env_%s", tmp_root, what);
    char *saved = getenv("MOEGEN_CACHE_DIR") ? strdup(getenv("MOEGEN_CACHE_DIR")) : NULL;
    setenv("MOEGEN_CACHE_DIR", edir, 1);
    CHECK(cache_get(&pd, tdir, NULL, &b, &hit) == 0);
    CHECK(hit == 0 && same_buf(&b, &first));
    count_entries(edir, &total, &temps);
    CHECKF(total == 1 && temps == 0, "%d files, %d temporaries in %s", total, temps, edir);
    CHECK(cache_get(&pd, tdir, NULL, &b, &hit) == 0);
    CHECK(hit == 1);
    env("MOEGEN_CACHE_DIR", saved);
    free(saved);

    snprintf(label, sizeof label, "cache (%s): an unwritable folder still compiles", what);
    CASE(label);
    CHECK(cache_get(&pd, tdir, "/proc/moegen_no_such_dir/cache", &b, &hit) == 0);
    CHECK(hit == 0 && same_buf(&b, &first));
    moe_buf_free(&first);
    moe_buf_free(&b);
    moe_plan_desc_free(&pd);
}

/* The cache folder is private and its entries are bound to their keys:
 * what another user could plant (a shared or linked folder, a linked
 * entry, a valid entry of another key) is refused or rebuilt, never run. */
static void test_cache_private(const char *tdir) {
    moe_plan_desc_t pd, pd2;
    moe_diag_t d;
    moe_buf_t b = {0}, first = {0}, other = {0};
    int hit = -1;
    char cdir[300], p[700], key[33], key2[33];
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    moe_override_t o = {"top_k=4"};
    CHECK(load_plan(SMALL, &o, 1, &pd2) == 0);
    CHECK(moe_cache_key(&pd, tdir, MOE_ARCH_SM90A, key, &d) == 0);
    CHECK(moe_cache_key(&pd2, tdir, MOE_ARCH_SM90A, key2, &d) == 0);

    CASE("cache private: under umask 000 the folder is created 0700 and entries 0600");
    snprintf(cdir, sizeof cdir, "%s/private/a/cache", tmp_root);
    mode_t old = umask(0);
    CHECK(cache_get(&pd, tdir, cdir, &first, &hit) == 0 && hit == 0);
    umask(old);
    struct stat st;
    CHECKF(stat(cdir, &st) == 0 && (st.st_mode & 0777) == 0700, "mode %o", (unsigned)(st.st_mode & 0777));
    snprintf(p, sizeof p, "%s/%s-%s.cubin", cdir, pd.spec.name, key);
    CHECKF(stat(p, &st) == 0 && (st.st_mode & 0777) == 0600, "mode %o", (unsigned)(st.st_mode & 0777));

    CASE("cache private: a valid entry of another key is not a hit");
    char p2[700];
    snprintf(p2, sizeof p2, "%s/%s-%s.cubin", cdir, pd.spec.name, key2);
    size_t len;
    char *data = read_bytes(p, &len);
    CHECK(data && write_bytes(p2, data, len) == 0);
    free(data);
    CHECK(cache_get(&pd2, tdir, cdir, &other, &hit) == 0);
    CHECKF(hit == 0, "the entry of key %s served key %s", key, key2);
    CHECK(other.len > 0 && !same_buf(&other, &first));
    CHECK(cache_get(&pd2, tdir, cdir, &b, &hit) == 0 && hit == 1 && same_buf(&b, &other));

    CASE("cache private: an entry that is a symbolic link is not followed; the rebuilt entry replaces the link");
    char target[700];
    snprintf(target, sizeof target, "%s/private/planted.cubin", tmp_root);
    CHECK(rename(p, target) == 0 && symlink(target, p) == 0);
    CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
    CHECKF(hit == 0, "a linked entry was used");
    CHECK(same_buf(&b, &first));
    CHECK(lstat(p, &st) == 0 && S_ISREG(st.st_mode));
    CHECK(lstat(target, &st) == 0 && S_ISREG(st.st_mode));

    CASE("cache private: a folder writable by others is refused, naming it");
    CHECK(chmod(cdir, 0777) == 0);
    moe_buf_t none = {0};
    CHECK(moe_cache_cubin(&pd, tdir, MOE_ARCH_SM90A, cdir, &none, &hit, &d) != 0);
    CHECKF(strstr(d.msg, cdir) && strstr(d.msg, "writable by other users (mode 0777)"), "%s", d.msg);
    CHECK(chmod(cdir, 0700) == 0);

    CASE("cache private: a folder that is a symbolic link is refused");
    char link[300];
    snprintf(link, sizeof link, "%s/private/link", tmp_root);
    CHECK(symlink(cdir, link) == 0);
    CHECK(moe_cache_cubin(&pd, tdir, MOE_ARCH_SM90A, link, &none, &hit, &d) != 0);
    CHECKF(strstr(d.msg, "is a symbolic link"), "%s", d.msg);
    snprintf(link, sizeof link, "%s/private/link/", tmp_root); /* a trailing slash would follow it */
    CHECK(moe_cache_cubin(&pd, tdir, MOE_ARCH_SM90A, link, &none, &hit, &d) != 0);
    CHECKF(strstr(d.msg, "is a symbolic link"), "%s", d.msg);

    CASE("cache private: a folder of another user is refused");
    char theirs[300];
    snprintf(theirs, sizeof theirs, "%s/private/theirs", tmp_root);
    CHECK(mkdir(theirs, 0755) == 0);
    if (geteuid() == 0) /* root: give it to nobody; else the folder "/" is root's */
        CHECK(chown(theirs, 65534, 65534) == 0);
    else
        snprintf(theirs, sizeof theirs, "/");
    CHECK(moe_cache_cubin(&pd, tdir, MOE_ARCH_SM90A, theirs, &none, &hit, &d) != 0);
    CHECKF(strstr(d.msg, "belongs to user"), "%s", d.msg);
    moe_buf_free(&none);
    moe_buf_free(&b);
    moe_buf_free(&first);
    moe_buf_free(&other);
    moe_plan_desc_free(&pd);
    moe_plan_desc_free(&pd2);
}

static void test_cache(void) {
    test_cache_dir();

    char t0[300];
    snprintf(t0, sizeof t0, "%s/tpl_cache", tmp_root);
    CASE("cache: template folder");
    CHECK(make_templates(t0, 1) == 0);
    cache_behaviour("stub templates", t0);
    test_cache_private(t0);

    CASE("cache key: arch, spec and template content");
    moe_plan_desc_t pd, pd2;
    moe_diag_t d;
    char k1[33], k2[33], k3[33], k4[33];
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    moe_override_t o = {"top_k=4"};
    CHECK(load_plan(SMALL, &o, 1, &pd2) == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k1, &d) == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k2, &d) == 0);
    CHECK_STREQ(k1, k2);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM80, k2, &d) == 0);
    CHECK(strcmp(k1, k2) != 0);
    CHECK(moe_cache_key(&pd2, t0, MOE_ARCH_SM90A, k2, &d) == 0);
    CHECK(strcmp(k1, k2) != 0);
    CHECK(put_template(t0, "gemm_down", "@ -- changed\nextern \"C\" __global__ void ${p.kernel}() {}\n") == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k3, &d) == 0);
    CHECKF(strcmp(k1, k3) != 0, "changing gemm_down.lua kept the key");
    /* A helper imported from the --templates folder is a template in use: a
     * change to it must change the key too, or the cache serves a stale cubin. */
    CHECK(put_template(t0, "zz_test_helper", "@ return { n = 1 }\n") == 0);
    CHECK(put_template(t0, "route", "@ local h = import(\"zz_test_helper\")\n"
                                     "extern \"C\" __global__ void ${p.kernel}(int *c) { if (c) c[0] = ${h.n}; }\n") == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k3, &d) == 0);
    CHECK(put_template(t0, "zz_test_helper", "@ return { n = 2 }\n") == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k4, &d) == 0);
    CHECKF(strcmp(k3, k4) != 0, "changing an imported helper in the --templates folder kept the cache key");
    moe_plan_desc_free(&pd);
    moe_plan_desc_free(&pd2);

    CASE("cache with the embedded templates");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent: the kernel templates are not all written yet", missing_template);
        return;
    }
    cache_behaviour("embedded templates", NULL);
}


int main(void) {
    if (gen_fixture_setup("test_cache"))
        return 1;
    double t = now();
    test_cache();
    fprintf(stderr, "test_cache: cases in %.1f s\n", now() - t);
    rm_rf(tmp_root);
    return check_report("test_cache");
}
