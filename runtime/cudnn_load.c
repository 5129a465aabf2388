/* cudnn_load.c — loading libcudnn with dlopen (once per process) and
 * resolving its functions. See cudnn.h. */
#define _GNU_SOURCE
#include "cudnn_impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#if MOE_HAVE_CUDNN_H
struct moe_dn_table moe_dn;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded_version;
static char loaded_key[1024];   /* the path asked for ("" = the default search) */
static char loaded_from[1200];  /* what was loaded, for messages */

static const char *const engine_libs[] = {"libcudnn_heuristic.so.9", "libcudnn_engines_runtime_compiled.so.9",
                                          "libcudnn_engines_precompiled.so.9"};
#endif

int moe_cudnn_load(const char *path, int *version, char *why, size_t n) {
#if !MOE_HAVE_CUDNN_H
    (void)path;
    *version = 0;
    snprintf(why, n, "libmoegen was built without <cudnn_graph.h>, so it has no cuDNN path");
    return -1;
#else
    const char *key = path ? path : "";
    pthread_mutex_lock(&load_lock);
    if (loaded_version) {
        int same = strcmp(key, loaded_key) == 0;
        if (!same)
            snprintf(why, n, "this process already loaded %s (asked for %s); a process holds one cuDNN",
                     loaded_from, path ? path : "the default search");
        *version = same ? loaded_version : 0;
        pthread_mutex_unlock(&load_lock);
        return same ? 0 : -1;
    }
    void *h = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_NOLOAD);
    char from[1200];
    if (h) {
        snprintf(from, sizeof from, "the cuDNN this process had already loaded");
    } else if (path) {
        struct stat sb;
        char dir[1024];
        if (stat(path, &sb) != 0) {
            snprintf(why, n, "cuDNN path %s: no such file or folder", path);
            pthread_mutex_unlock(&load_lock);
            return -1;
        }
        snprintf(dir, sizeof dir, "%s", path);
        if (!S_ISDIR(sb.st_mode)) {
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = '\0';
            else
                snprintf(dir, sizeof dir, ".");
        }
        char lib[1200];
        snprintf(lib, sizeof lib, "%s/libcudnn_graph.so.9", dir);
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(why, n, "dlopen(%s): %s", lib, dlerror());
            pthread_mutex_unlock(&load_lock);
            return -1;
        }
        /* the engines by full path too: later loads by soname then find these */
        for (size_t i = 0; i < sizeof engine_libs / sizeof *engine_libs; i++) {
            char e[1200];
            snprintf(e, sizeof e, "%s/%s", dir, engine_libs[i]);
            if (stat(e, &sb) == 0)
                dlopen(e, RTLD_NOW | RTLD_LOCAL);
        }
        snprintf(from, sizeof from, "%s", lib);
    } else {
        h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(why, n, "dlopen(libcudnn.so.9): %s (set MOEGEN_CUDNN_PATH or moe_options.cudnn_path to "
                     "cuDNN's lib folder)", dlerror());
            pthread_mutex_unlock(&load_lock);
            return -1;
        }
        snprintf(from, sizeof from, "libcudnn.so.9 (the default search)");
    }
    why[0] = '\0';
#define MOE_DN_RESOLVE(fn)                                                                     \
    if (!why[0] && !(*(void **)&moe_dn.fn = dlsym(h, #fn)))                                        \
        snprintf(why, n, "%s has no symbol %s (cuDNN 9 is needed)", from, #fn);
    MOE_DN_FUNCTIONS(MOE_DN_RESOLVE)
#undef MOE_DN_RESOLVE
    if (why[0]) {
        memset(&moe_dn, 0, sizeof moe_dn);
        pthread_mutex_unlock(&load_lock);
        return -1;
    }
    loaded_version = (int)moe_dn.cudnnGetVersion();
    snprintf(loaded_key, sizeof loaded_key, "%s", key);
    char v[32];
    moe_cudnn_version_string(loaded_version, v, sizeof v);
    snprintf(loaded_from, sizeof loaded_from, "cuDNN %s from %s", v, from);
    *version = loaded_version;
    pthread_mutex_unlock(&load_lock);
    return 0;
#endif
}
