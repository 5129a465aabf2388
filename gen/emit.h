/* emit.h — build the emitted files of one spec in memory, then write them
 * all or none. */
#ifndef MOEGEN_EMIT_H
#define MOEGEN_EMIT_H

#include "plan.h"
#include "spec.h"
#include "util.h"
#include "version.h"

typedef struct {
    char path[256];   /* relative to the output folder */
    moe_buf_t data;
} moe_file_t;

typedef struct {
    moe_file_t files[16];
    int nfiles;
} moe_fileset_t;

/* The string NAME.cu's NAME_moegen_spec holds before the spec hash; its
 * cubins carry it, which binds them to the spec. */
#define MOE_SPEC_MARK "moegen-spec:"

/* The CUDA source for a plan: the stamp, the prelude (templates/prelude.lua),
 * the forward's kernels (the family table walked: arch-neutral ones once,
 * each arch's GEMMs once per distinct name), the cuDNN path's swiglu kernel,
 * the EP kernels when mesh.ep > 1, and the vendored host launcher
 * (templates/host.lua, with gen/launch_geom.h pasted in) under #ifndef
 * __CUDACC_RTC__. templates_dir as in moe_tmpl_open. Returns 0 or non-zero
 * with diag set. */
int moe_emit_source(const moe_plan_desc_t *pd, const char *templates_dir, moe_buf_t *out, moe_diag_t *diag);

/* Every emitted file of a plan (NAME.cu, NAME.h, manifest.json, NAME.moe)
 * into fs. Returns 0 or non-zero with diag set. */
int moe_emit_files(const moe_plan_desc_t *pd, const char *templates_dir, moe_fileset_t *fs, moe_diag_t *diag);

/* Write fs's manifest.json again, its "cubins" now listing each
 * NAME.ARCH.cubin that fs holds (size and XXH3-128): moegen compile calls
 * it after adding the cubins, binding them to the spec and kernels the
 * manifest records. Returns 0 or non-zero with diag set. */
int moe_emit_manifest_update(const moe_plan_desc_t *pd, const char *templates_dir, moe_fileset_t *fs,
                             moe_diag_t *diag);

/* Add a file to a set; returns its buffer, or NULL when the set is full. */
moe_buf_t *moe_fileset_add(moe_fileset_t *fs, const char *path);
void moe_fileset_free(moe_fileset_t *fs);

/* Write every file under dir (created if missing), each through a temporary
 * file; the renames happen only after every temporary was written, so on
 * failure nothing new is left behind. Unchanged files are not touched.
 * Returns 0 or -1 with err set. */
int moe_fileset_write(const moe_fileset_t *fs, const char *dir, char *err, size_t errlen);

#endif
