/* fuzz_emit.c — libFuzzer harness over emission (`make fuzz`): a spec the
 * planner accepts must emit. The input is fuzz_spec.c's (a spec, then
 * "\n--set\n" and KEY=VALUE override lines; the first byte's bits 1-3 the
 * tuning table: 0 the embedded one, 1-7 tests/tune's), always read as text.
 * Slower than fuzz_spec (the templates run in Lua for every input), so it
 * takes the inputs that get that far.
 *
 * What it asserts besides "no crash, no leak, no undefined behaviour": a
 * planned spec emits its four files (a refusal this late would reach the
 * user after the planner said yes); the emitted source defines every kernel
 * the plan names for each of the spec's arches, every GEMM variant's
 * included, under its name; manifest.json is JSON that jansson reads as the
 * runtime does (moe_plan_create_from_dir) with the spec's name and hash; and
 * the mesh tables' JSON (moegen plan --json) is JSON. */
#include "fuzz_input.h"
#include "emit.h"
#include "mesh.h"
#include "plan.h"

#include <jansson.h>

static void require(int ok, const char *what, const char *detail) {
    if (!ok) {
        fprintf(stderr, "fuzz_emit: %s\n%s\n", what, detail ? detail : "");
        __builtin_trap();
    }
}

/* Whether src defines kernel name: `NAME(` with "__global__" before it on
 * its line or the line above (`extern "C" __global__ void
 * __launch_bounds__(...)` stands on a line of its own), `#line` directives
 * between them not counted (the templates emit one before the name when
 * the attribute line came out of a template branch). */
static int defines(const char *src, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(src, name); p; p = strstr(p + 1, name)) {
        if (p[n] != '(')
            continue;
        const char *from = p;
        for (int lines = 0; from > src && lines < 2; from--)
            if (from[-1] == '\n' && strncmp(from, "#line ", 6) != 0 && ++lines == 2)
                break;
        char head[1024];
        snprintf(head, sizeof head, "%.*s", (int)(p - from), from);
        if (strstr(head, "__global__"))
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in;
    if (fuzz_input_split(&in, data, size))
        return 0;
    moe_spec_t s;
    moe_diag_t d;
    if (moe_spec_load(&s, "fuzz.moe", in.spec, in.ovr, in.novr, &d)) {
        fuzz_input_free(&in);
        return 0;
    }
    moe_plan_desc_t pd;
    char err[512] = "";
    if (moe_plan_desc_build(&pd, &s, fuzz_tuning_of(in.table), err, sizeof err) != 0) {
        fuzz_input_free(&in);
        return 0;
    }
    moe_fileset_t fs = {0};
    require(moe_emit_files(&pd, NULL, &fs, &d) == 0, "a spec the planner accepts does not emit", d.msg);
    require(fs.nfiles == 4, "emission did not give four files", NULL);
    const char *cu = fs.files[0].data.data;
    for (int a = 0; a < pd.spec.narch; a++) {
        const moe_arch_t arch = pd.spec.arch[a];
        for (int k = 0; k < MOE_K_COUNT; k++)
            require(defines(cu, moe_plan_kernels(&pd, arch)[k].name), "the source lacks a planned kernel",
                    moe_plan_kernels(&pd, arch)[k].name);
        for (int v = 0; v < pd.nvariants; v++)
            for (int k = 0; k < MOE_K_COUNT; k++)
                require(defines(cu, pd.variants[v].kernels[arch][k].name), "the source lacks a GEMM variant's kernel",
                        pd.variants[v].kernels[arch][k].name);
    }
    /* manifest.json, read as moe_plan_create_from_dir reads it */
    const moe_buf_t *man = &fs.files[2].data;
    require(strcmp(fs.files[2].path, "manifest.json") == 0, "the third file is not manifest.json", fs.files[2].path);
    json_error_t je;
    json_t *root = json_loadb(man->data, man->len, JSON_REJECT_DUPLICATES, &je);
    char why[512];
    snprintf(why, sizeof why, "%d:%d: %s", je.line, je.column, je.text);
    require(root != NULL, "manifest.json is not JSON", why);
    const char *name = json_string_value(json_object_get(root, "name"));
    const char *hash = json_string_value(json_object_get(root, "hash"));
    require(name && strcmp(name, pd.spec.name) == 0, "manifest.json's name is not the spec's", name);
    require(hash && strcmp(hash, pd.spec.hash) == 0, "manifest.json's hash is not the spec's", hash);
    json_decref(root);
    /* the mesh tables as moegen plan --json prints them */
    char *mesh = moe_mesh_plan_json(&pd.mesh, -1);
    require(mesh != NULL, "moe_mesh_plan_json returned NULL", NULL);
    root = json_loads(mesh, JSON_REJECT_DUPLICATES, &je);
    snprintf(why, sizeof why, "%d:%d: %s", je.line, je.column, je.text);
    require(root != NULL, "the mesh plan's JSON is not JSON", why);
    json_decref(root);
    free(mesh);
    moe_fileset_free(&fs);
    moe_plan_desc_free(&pd);
    fuzz_input_free(&in);
    return 0;
}
