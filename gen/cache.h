/* cache.h — the JIT path: plan -> source -> NVRTC cubin, through a disk
 * cache (docs/DESIGN.md, "JIT cache").
 *
 * Key: spec hash, generator version, template content hash, NVRTC version,
 * target arch, compile options. An entry is a header (magic, payload hash,
 * length) and the cubin, written to a unique temporary name and renamed into
 * place, so concurrent writers of one key each leave a whole entry and
 * readers never see a partial one. A bad entry is a miss and is rebuilt. */
#ifndef MOEGEN_CACHE_H
#define MOEGEN_CACHE_H

#include "plan.h"
#include "util.h"

/* The cache folder: $MOEGEN_CACHE_DIR, else $XDG_CACHE_HOME/moegen, else
 * $HOME/.cache/moegen; "" when none can be named (caching is then off). */
void moe_cache_dir(char *out, size_t n);

/* The hex key of (plan, templates, the emitted source, NVRTC, arch): any change
 * to what NVRTC would compile changes it. Returns 0, or non-zero with diag. */
int moe_cache_key(const moe_plan_desc_t *pd, const char *templates_dir, moe_arch_t arch, char key[33],
                  moe_diag_t *diag);

/* Get the cubin for (plan, arch): from cache_dir (NULL = moe_cache_dir())
 * when a valid entry exists, else by generating and compiling, then storing
 * it. *hit tells which. The folder is created 0700; one that is a symbolic
 * link, belongs to another user or is writable by others is refused (an
 * error, not a silent miss); entries are regular files (links are not
 * followed), created 0600, and valid only under their own key's name.
 * Returns 0, or non-zero with diag set. */
int moe_cache_cubin(const moe_plan_desc_t *pd, const char *templates_dir, moe_arch_t arch, const char *cache_dir,
                    moe_buf_t *cubin, int *hit, moe_diag_t *diag);

#endif
