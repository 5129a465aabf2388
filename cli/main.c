/* main.c — the moegen command. Exit status: 0 done, 2 bad input (spec or
 * usage), 1 anything else (I/O, NVRTC, GPU). */
#define _POSIX_C_SOURCE 200809L
#include "emit.h"
#include "ep_plan.h"
#include "mesh.h"
#include "compile.h"
#include "plan.h"
#include "moe.h"
#include "moe_internal.h"
#include "tune.h"
#include "tuning.h"
#include "spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS 64

static const char *const usage_text =
    "usage: moegen COMMAND SPEC [options]\n"
    "\n"
    "Generate CUDA C for one Mixture-of-Experts layer shape.\n"
    "\n"
    "commands:\n"
    "  check SPEC              validate a spec and print its canonical form and hash (SPEC - : stdin)\n"
    "  emit SPEC -o DIR        write DIR/NAME.cu, DIR/NAME.h, DIR/manifest.json, DIR/NAME.moe\n"
    "  compile SPEC -o DIR     emit, and also write DIR/NAME.ARCH.cubin and .ptx through NVRTC\n"
    "  plan SPEC [--rank R] [--json]\n"
    "                          print the kernel plan and the mesh tables\n"
    "  tune SPEC [--tokens a,b,c] [--iters N] [--grid g,h] [-o TABLE]\n"
    "                          time candidate sm_90a GEMM tiles on the GPU; write tuning table entries\n"
    "  help [COMMAND]          print help\n"
    "\n"
    "options (OPTION VALUE or --OPTION=VALUE; each command takes only its own, see moegen help COMMAND):\n"
    "  -o DIR, --output DIR    output folder (emit, compile)\n"
    "  --set KEY=VALUE         override a spec key (router.score=sigmoid, arch=sm_90a,sm_80); repeatable\n"
    "                          (check, emit, compile, plan)\n"
    "  --templates DIR         read templates from DIR instead of the embedded copies (emit, compile)\n"
    "  --rank R, --json        one rank's tables; the tables as JSON (plan)\n"
    "  --tuning FILE           take sm_90a GEMM tiles from this tuning table instead of the embedded\n"
    "                          tuning/h200.tune (emit, compile, plan; default: $MOEGEN_TUNING if set)\n"
    "  --help, --version\n";

static const struct {
    const char *name, *text;
} help_texts[] = {
    {"check", "usage: moegen check SPEC [--set KEY=VALUE]... [--tuning FILE]\n\n"
              "Validate SPEC. Prints the canonical spec (sorted keys, defaults filled in) and its hash.\n"
              "Errors read FILE:LINE: error: MESSAGE; exit status 2.\n"},
    {"emit", "usage: moegen emit SPEC -o DIR [--set KEY=VALUE]... [--tuning FILE] [--templates DIR]\n\n"
             "Write DIR/NAME.cu (device kernels, plus host launch code under #ifndef __CUDACC_RTC__),\n"
             "DIR/NAME.h (argument struct, launch and packing functions, workspace size, layouts),\n"
             "DIR/manifest.json (canonical spec, hash, kernels with tile configurations, arch list,\n"
             "routing table) and DIR/NAME.moe (the canonical spec). All or nothing; unchanged files\n"
             "are not touched; the same spec gives byte-identical files.\n"},
    {"compile", "usage: moegen compile SPEC -o DIR [--set KEY=VALUE]... [--tuning FILE] [--templates DIR]\n\n"
                "As emit, then compile NAME.cu with NVRTC for every arch of the spec, writing\n"
                "DIR/NAME.ARCH.cubin and DIR/NAME.ARCH.ptx. A folder written by compile can be loaded\n"
                "by the runtime with no NVRTC (moe_plan_create_from_dir).\n"},
    {"plan", "usage: moegen plan SPEC [--rank R] [--json] [--set KEY=VALUE]... [--tuning FILE]\n\n"
             "Print the kernel plan (kernels, tiles, workspace) and the mesh tables: every rank's\n"
             "coordinates, EP and FSDP peers, stored experts, experts after the FSDP gather, and the\n"
             "routing table (owner EP rank and slot of every expert). --rank R prints one rank;\n"
             "--json prints the mesh tables as one JSON object (see docs/mesh.md).\n"},
    {"tune", NULL}, /* cli/tune.c: moe_tune_usage */
    {"help", "usage: moegen help [COMMAND]\n"},
};

typedef struct {
    const char *cmd, *spec, *out, *templates, *tuning;
    moe_override_t sets[MAX_SETS];
    int nsets;
    int rank, json;
    const moe_tuning_t *table;  /* --tuning's, $MOEGEN_TUNING's or the embedded table: what the plan takes */
} args_t;

static int print_help(const char *cmd) {
    if (!cmd) {
        fputs(usage_text, stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof help_texts / sizeof *help_texts; i++)
        if (strcmp(help_texts[i].name, cmd) == 0) {
            fputs(help_texts[i].text ? help_texts[i].text : moe_tune_usage, stdout);
            return 0;
        }
    fprintf(stderr, "moegen: error: no command '%s' (try moegen --help)\n", cmd);
    return 2;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "moegen: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try moegen --help)\n");
    return 2;
}

static int parse_int_arg(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* Every option: its name, a long form, whether it takes a value, and the
 * commands it applies to (any other command refuses it). */
static const struct {
    const char *name, *alias;
    int value;
    const char *cmds;
} options[] = {
    {"-o", "--output", 1, " emit compile "},
    {"--set", NULL, 1, " check emit compile plan "},
    {"--tuning", NULL, 1, " check emit compile plan "},
    {"--templates", NULL, 1, " emit compile "},
    {"--rank", NULL, 1, " plan "},
    {"--json", NULL, 0, " plan "},
};
#define NOPTIONS (sizeof options / sizeof *options)

/* The option named s (or its long form; "--name=value" gives the value
 * after '=' in *inline_val), or -1. */
static int find_option(const char *s, char *name, size_t n, const char **inline_val) {
    const char *eq = strncmp(s, "--", 2) == 0 ? strchr(s, '=') : NULL;
    size_t l = eq ? (size_t)(eq - s) : strlen(s);
    snprintf(name, n, "%.*s", (int)l, s);
    *inline_val = eq ? eq + 1 : NULL;
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(name, options[i].name) == 0 || (options[i].alias && strcmp(name, options[i].alias) == 0))
            return (int)i;
    return -1;
}

static int parse_args(int argc, char **argv, args_t *a) {
    memset(a, 0, sizeof *a);
    a->rank = -1;
    unsigned seen = 0; /* options given, by index: checked against the command below */
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *s = argv[i], *inl = NULL;
        int o = s[0] == '-' && s[1] ? find_option(s, name, sizeof name, &inl) : -1;
        if (o >= 0 && !options[o].value) {
            if (inl)
                return usage_error("%s takes no value", name);
            seen |= 1u << o;
            a->json = 1;
        } else if (o >= 0) {
            const char *val = inl ? inl : i + 1 < argc ? argv[i + 1] : NULL;
            if (!val)
                return usage_error("%s needs a value", name);
            if (!inl)
                i++;
            seen |= 1u << o;
            s = options[o].name;
            if (strcmp(s, "-o") == 0)
                a->out = val;
            else if (strcmp(s, "--tuning") == 0)
                a->tuning = val;
            else if (strcmp(s, "--templates") == 0)
                a->templates = val;
            else if (strcmp(s, "--set") == 0) {
                if (a->nsets == MAX_SETS)
                    return usage_error("too many --set options (at most 64)%s", "");
                a->sets[a->nsets++].text = val;
            } else if (strcmp(s, "--rank") == 0) {
                if (parse_int_arg(val, 0, 1 << 30, &a->rank))
                    return usage_error("--rank needs a rank number, got '%s'", val);
            }
        } else if (s[0] == '-' && s[1]) {
            return usage_error("unknown option '%s'", s);
        } else if (!a->cmd) {
            a->cmd = s;
        } else if (!a->spec) {
            a->spec = s;
        } else {
            return usage_error("unexpected argument '%s'", s);
        }
    }
    for (size_t o = 0; o < NOPTIONS && a->cmd; o++) {
        char want[40];
        snprintf(want, sizeof want, " %s ", a->cmd);
        if ((seen >> o & 1u) && strstr(" check emit compile plan ", want) && !strstr(options[o].cmds, want)) {
            char list[80];
            size_t n = 0;
            for (const char *c = options[o].cmds + 1; *c && n + 3 < sizeof list; c++)
                if (*c != ' ')
                    list[n++] = *c;
                else if (c[1])
                    list[n++] = ',', list[n++] = ' ';
            list[n] = '\0';
            fprintf(stderr, "moegen: error: %s does not apply to %s (only to %s)\n(try moegen help %s)\n",
                    options[o].name, a->cmd, list, a->cmd);
            return 2;
        }
    }
    return 0;
}

/* Load and validate the spec, then build the plan (which the caller frees
 * with moe_plan_desc_free). Prints the error and returns the exit status on
 * failure. */
static int load(const args_t *a, moe_spec_t *spec, moe_plan_desc_t *plan) {
    moe_diag_t d;
    char *text = NULL; /* SPEC "-": the spec is standard input (at most 1 MiB, as a file) */
    const char *path = a->spec;
    if (strcmp(a->spec, "-") == 0) {
        moe_buf_t b = {0};
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0 && b.len <= (1u << 20))
            moe_buf_append(&b, chunk, n);
        path = "<stdin>";
        const char *why = ferror(stdin) || b.failed ? "cannot read standard input"
                          : b.len > (1u << 20)      ? "the spec on standard input is larger than 1048576 bytes"
                          : b.data && strlen(b.data) != b.len ? "the spec holds a NUL byte; a spec is text"
                                                               : NULL;
        if (why) {
            fprintf(stderr, "%s:1: error: %s\n", path, why);
            moe_buf_free(&b);
            return 2;
        }
        if (!b.data)
            moe_buf_append(&b, "", 0);
        text = b.data;
    }
    int bad = moe_spec_load(spec, path, text, a->sets, a->nsets, &d);
    free(text);
    if (bad) {
        fprintf(stderr, "%s\n", d.msg);
        return 2;
    }
    char err[512];
    if (moe_plan_desc_build(plan, spec, a->table, err, sizeof err)) {
        char msg[1200];
        moe_spec_error_at(spec, path, err, msg, sizeof msg); /* the line of the key it names */
        fprintf(stderr, "%s\n", msg);
        return 2;
    }
    return 0;
}

static int cmd_check(const args_t *a) {
    moe_spec_t spec;
    moe_plan_desc_t plan;
    int rc = load(a, &spec, &plan);
    if (rc)
        return rc;
    moe_plan_desc_free(&plan);
    char *canon = moe_spec_canonical(&spec);
    printf("%s-- hash %s\n", canon ? canon : "", spec.hash);
    free(canon);
    return 0;
}

/* emit and compile: everything in memory first, then one write. */
static int cmd_emit(const args_t *a, int compile) {
    if (!a->out || !a->out[0])
        return usage_error("%s needs -o DIR (a folder name, not empty)", a->cmd);
    moe_spec_t spec;
    moe_plan_desc_t plan;
    int rc = load(a, &spec, &plan);
    if (rc)
        return rc;
    moe_fileset_t fs = {0};
    moe_diag_t d;
    rc = moe_emit_files(&plan, a->templates, &fs, &d);
    if (rc) {
        fprintf(stderr, "%s\n", d.msg);
        moe_plan_desc_free(&plan);
        moe_fileset_free(&fs);
        return 2;
    }
    if (compile) {
        const moe_buf_t *src = &fs.files[0].data;
        char cuname[128];
        snprintf(cuname, sizeof cuname, "%s.cu", spec.name);
        for (int i = 0; i < spec.narch; i++) {
            char path[160];
            snprintf(path, sizeof path, "%s.%s.cubin", spec.name, moe_arch_name(spec.arch[i]));
            moe_buf_t *cubin = moe_fileset_add(&fs, path);
            snprintf(path, sizeof path, "%s.%s.ptx", spec.name, moe_arch_name(spec.arch[i]));
            moe_buf_t *ptx = moe_fileset_add(&fs, path);
            moe_buf_t log = {0};
            if (moe_nvrtc_compile(src->data, cuname, spec.arch[i], cubin, ptx, &log, &d)) {
                const size_t len = strlen(d.msg);
                fprintf(stderr, "%s%s", d.msg, len && d.msg[len - 1] == '\n' ? "" : "\n");
                moe_buf_free(&log);
                moe_plan_desc_free(&plan);
                moe_fileset_free(&fs);
                return 1;
            }
            if (log.len)
                fprintf(stderr, "%s (%s): NVRTC warnings:\n%s", cuname, moe_arch_name(spec.arch[i]), log.data);
            moe_buf_free(&log);
        }
        /* the manifest records each cubin's hash: the folder's binding */
        if (moe_emit_manifest_update(&plan, a->templates, &fs, &d)) {
            fprintf(stderr, "%s\n", d.msg);
            moe_plan_desc_free(&plan);
            moe_fileset_free(&fs);
            return 1;
        }
    }
    moe_plan_desc_free(&plan);
    char err[512];
    if (moe_fileset_write(&fs, a->out, err, sizeof err)) {
        fprintf(stderr, "moegen: error: %s\n", err);
        moe_fileset_free(&fs);
        return 1;
    }
    moe_fileset_free(&fs);
    return 0;
}

/* Which path each FFN stage takes on this machine's GPU 0 (docs/cudnn.md):
 * the runtime builds the plan (JIT, cached) and says. Without a
 * GPU it says why nothing was decided; a mesh of several devices runs the
 * generated kernels. */
static void print_stage_paths(const char *path, const moe_spec_t *spec, const moe_tuning_t *table) {
    static const char *const names[MOE_STAGE_COUNT] = {"up+SwiGLU", "down"};
    printf("ffn stage paths");
    if (spec->mesh.size[MOE_AXIS_DP] * spec->mesh.size[MOE_AXIS_FSDP] * spec->mesh.size[MOE_AXIS_EP] > 1) {
        printf(": generated kernels (a mesh of several devices; the cuDNN path is for a mesh of one)\n\n");
        return;
    }
    char *canon = moe_spec_canonical(spec);
    moe_plan *plan = NULL;
    moe_status s = canon ? moe_plan_create_tuned(&plan, path, canon, NULL, table) : MOE_ERR_NO_MEMORY;
    free(canon);
    if (s != MOE_OK) {
        printf(": not decided here (%s)\n\n", moe_last_error());
        return;
    }
    moe_plan_info info;
    moe_plan_get_info(plan, &info);
    printf(" on GPU 0 (%s):\n", info.arch);
    for (int i = 0; i < MOE_STAGE_COUNT; i++) {
        int at;
        const char *why;
        moe_plan_stage_path(plan, i, &at, &why);
        printf("  %-10s %-9s %s\n", names[i], at == MOE_PATH_CUDNN ? "cuDNN" : "generated", why);
    }
    printf("\n");
    moe_plan_destroy(plan);
}

/* A GEMM's tile, engine and grid, as `moegen plan` prints them. */
static void print_gemm_tile(const moe_kernel_desc_t *k) {
    const moe_tile_cfg_t *t = &k->tile;
    char grid[48];
    snprintf(grid, sizeof grid, "%d CTAs per tile splitting K", t->splitk);
    if (t->gemv)
        printf("  gemv, %d weight rows per CTA of a %d-row tile, rows in chunks of 8, K unrolled %d", t->bn, t->bm,
               t->stages);
    else if (t->consumers)
        printf("  tile %dx%dx%d, %d stages, wgmma + TMA, %s%s, %d consumer warpgroup%s", t->bm, t->bn, t->bk, t->stages,
               t->pingpong ? "persistent grid, ping-pong" : t->persistent ? "persistent grid" : t->splitk ? grid
                                                                                              : "one CTA per tile",
               t->cluster ? " in CTA pairs (weights multicast)" : "", t->consumers, t->consumers == 1 ? "" : "s");
    else
        printf("  tile %dx%dx%d, %d stages, %dx%d warps, mma.sync", t->bm, t->bn, t->bk, t->stages, t->warps_m,
               t->warps_n);
}

static int cmd_plan(const args_t *a) {
    moe_spec_t spec;
    moe_plan_desc_t plan;
    int rc = load(a, &spec, &plan);
    if (rc)
        return rc;
    const moe_mesh_plan_t *mesh = &plan.mesh;
    if (a->rank >= mesh->world) {
        fprintf(stderr, "moegen: error: --rank %d is out of range: the mesh has %d devices (ranks 0..%d)\n", a->rank,
                mesh->world, mesh->world - 1);
        moe_plan_desc_free(&plan);
        return 2;
    }
    char *text = a->json ? moe_mesh_plan_json(mesh, a->rank) : moe_mesh_plan_table(mesh, a->rank);
    if (!a->json) {
        char zero[48] = ""; /* zero experts: scored by the router beside the E, no weights */
        if (spec.zero_experts)
            snprintf(zero, sizeof zero, " (+%d zero experts)", spec.zero_experts);
        printf("plan %s (hash %s), %s%s%s, E=%d%s top_k=%d H=%d F=%d, up to %d tokens\n\n", spec.name, spec.hash,
               moe_dtype_name(spec.dtype), moe_spec_fp8(&spec) ? ", fp8 e4m3 expert weights with scales per " : "",
               !moe_spec_fp8(&spec) ? "" : spec.quant.scaling == MOE_SCALING_BLOCK ? "128x128 block" : "row",
               spec.experts, zero, spec.top_k, spec.hidden, spec.ffn, spec.tokens);
        printf("kernels (sm_90a; sm_80 runs the same but mma.sync GEMMs, see manifest.json):\n");
        for (int i = 0; i < MOE_K_COUNT; i++) {
            const moe_kernel_desc_t *k = &moe_plan_kernels(&plan, MOE_ARCH_SM90A)[i];
            printf("  %-58s threads %4d  smem %6d", k->name, k->threads, k->smem);
            if (i == MOE_K_GEMM_UP || i == MOE_K_GEMM_DOWN)
                print_gemm_tile(k);
            printf("\n");
        }
        const moe_kernel_desc_t *bg = moe_plan_bgemm(&plan, MOE_ARCH_SM90A);
        if (bg) {
            const int half = moe_wgrad_elem_bytes(&plan.spec) == 2; /* spec weight_grads = "dtype" */
            printf("backward GEMMs (training = true; weight gradients %s%s; sm_90a; sm_80's are mma.sync ones, see "
                   "manifest.json):\n", half ? moe_dtype_name(plan.spec.dtype) : "fp32",
                   half ? ", weight_grads = \"dtype\"" : "");
            for (int i = 0; i < MOE_BGEMM_COUNT; i++) {
                printf("  %-58s threads %4d  smem %6d", bg[i].name, bg[i].threads, bg[i].smem);
                print_gemm_tile(&bg[i]);
                printf("\n");
            }
        }
        const moe_tuning_entry_t *te = plan.tuned;
        if (te)
            printf("sm_90a GEMM tiles: %s:%d (%d-token bucket; %.1f us, runner-up %.1f us, %s, %s)\n",
                   a->table->file, te->line, te->tokens, te->best_us, te->runner_up_us, te->date, te->gpu);
        else
            printf("sm_90a GEMM tiles: heuristics (no entry in %s)\n", a->table->file);
        if (bg) { /* the backward entries completing the entry of the spec's tokens (docs/tuning.md) */
            const moe_tuning_entry_t *cap = moe_tuning_find(a->table, &plan.spec, MOE_ARCH_SM90A);
            printf("backward GEMM tiles:");
            for (int i = 0; i < MOE_BGEMM_COUNT; i++) {
                const moe_tuning_entry_t *b = moe_tuning_find_bgemm(a->table, cap, MOE_K_BGEMM_FIRST + i);
                const char *name = moe_family((moe_kfamily_t)(MOE_K_BGEMM_FIRST + i))->name;
                if (b)
                    printf("%s %s %s:%d", i ? "," : "", name, a->table->file, b->line);
                else
                    printf("%s %s heuristics", i ? "," : "", name);
            }
            printf("\n");
        }
        if (plan.nvariants > 1) { /* docs/tuning.md, "Variants per call size" */
            printf("GEMM variants (a call of T tokens runs the one with the largest bucket <= T; the kernels "
                   "above are the last's):\n");
            for (int v = 0; v < plan.nvariants; v++) {
                const moe_plan_variant_t *pv = &plan.variants[v];
                char from[48];
                if (v + 1 < plan.nvariants)
                    snprintf(from, sizeof from, "%d .. %d tokens", v ? pv->bucket : 1, plan.variants[v + 1].bucket - 1);
                else
                    snprintf(from, sizeof from, "%d .. %d tokens", v ? pv->bucket : 1, spec.tokens);
                printf("  %-22s bucket %5d, bm %3d: %s, %s%s\n", from, pv->bucket, pv->align,
                       pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].name, pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_DOWN].name,
                       pv->pdl ? " (+pdl: launch overlap unless MOEGEN_PDL=off)" : "");
            }
        }
        const moe_ep_desc_t *ep = moe_plan_ep_desc(&plan);
        if (ep) {
            printf("dispatch (%s", ep->capacity ? "capacity mode" : "exact mode");
            if (ep->capacity)
                printf(", %d rows per peer", ep->capacity);
            printf("; the permute kernels above are not used):\n");
            for (int i = 0; i < MOE_EK_COUNT; i++)
                printf("  %-58s threads %4d\n", ep->k[i].name, ep->k[i].threads);
            /* what a row weighs in the exchange (gen/ep_plan.h, moe_ep_row_parts) */
            printf("a row moves %lld bytes out (%s) and %lld bytes home (the %s results)\n",
                   moe_ep_row_bytes(&spec, 0),
                   moe_spec_fp8(&spec) ? "e4m3 with an fp32 scale per 128 columns, quantized by the sender"
                                       : moe_dtype_name(spec.dtype),
                   moe_ep_row_bytes(&spec, 1), moe_dtype_name(spec.dtype));
            printf("\nworkspace: %zu bytes at %d tokens per rank (send %lld rows, receive up to %lld rows, %lld "
                   "tiles of %d)\n", ep->ws_bytes, spec.tokens, ep->send_rows, ep->stage_rows, ep->max_tiles,
                   plan.align);
        } else {
            if (plan.nvariants > 1)
                printf("\nworkspace: %zu bytes at %d tokens (%lld rows and %lld tiles: the most any GEMM variant "
                       "needs)\n", plan.ws_bytes, spec.tokens, plan.max_rows, plan.max_tiles);
            else
                printf("\nworkspace: %zu bytes at %d tokens (%lld rows, %lld tiles of %d)\n", plan.ws_bytes,
                       spec.tokens, plan.max_rows, plan.max_tiles, plan.align);
        }
        if (plan.has_bwd) { /* training = true: the backward's own kernels and what a training forward keeps */
            printf("\nbackward kernels (training = true; the backward GEMMs besides):\n");
            for (int i = 0; i < MOE_BK_COUNT; i++)
                printf("  %-58s threads %4d  smem %6d\n", plan.bwd[i].name, plan.bwd[i].threads, plan.bwd[i].smem);
            moe_ws_region_t r[32];
            _Static_assert(MOE_SV_COUNT <= 32 && MOE_BW_COUNT <= 32 && MOE_ES_COUNT <= 32 && MOE_EB_COUNT <= 32, "r");
            const moe_ep_desc_t *ed = moe_plan_ep_desc(&plan); /* an EP rank keeps its received rows at their bound */
            const int T = spec.tokens;
            printf("saved region: %zu bytes per token saving U, %zu recomputing it (moe_plan_saved_per_token%s); "
                   "%zu and %zu bytes at %d tokens\n",
                   ed ? moe_ep_saved_per_token(ed, &plan, 0) : moe_saved_per_token(&plan, 0),
                   ed ? moe_ep_saved_per_token(ed, &plan, 1) : moe_saved_per_token(&plan, 1),
                   ed ? ", the token side's; the expert side's rows at the receive bound" : "",
                   ed ? moe_ep_saved_layout(ed, &plan, T, 0, r) : moe_saved_layout(&plan, T, 0, r),
                   ed ? moe_ep_saved_layout(ed, &plan, T, 1, r) : moe_saved_layout(&plan, T, 1, r), T);
            printf("backward workspace: %zu bytes at %d tokens (%zu recomputing U)\n",
                   ed ? moe_ep_bwd_ws_layout(ed, &plan, T, 0, r) : moe_bwd_ws_layout(&plan, T, 0, r), T,
                   ed ? moe_ep_bwd_ws_layout(ed, &plan, T, 1, r) : moe_bwd_ws_layout(&plan, T, 1, r));
        }
    }
    moe_plan_desc_free(&plan);
    if (!a->json)
        print_stage_paths(a->spec, &spec, a->table);
    if (!text) {
        fprintf(stderr, "moegen: error: out of memory\n");
        return 1;
    }
    fputs(text, stdout);
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "tune") == 0)
        return moe_tune_command(argc - 1, argv + 1); /* cli/tune.c parses its own options */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) /* the command's own help, if one is named */
            return print_help(argc > 1 && argv[1][0] != '-' && strcmp(argv[1], "help") != 0 ? argv[1] : NULL);
        if (strcmp(argv[i], "--version") == 0) {
            char v[32], why[600];
            if (moe_nvrtc_load(why, sizeof why)) {
                printf("moegen %s (%s)\n", MOEGEN_VERSION, why);
                return 0;
            }
            moe_nvrtc_version(v, sizeof v);
            printf("moegen %s (NVRTC %s)\n", MOEGEN_VERSION, v);
            return 0;
        }
    }
    args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    if (!a.cmd)
        return print_help(NULL), 2;
    if (strcmp(a.cmd, "help") == 0)
        return print_help(a.spec);
    static const char *const needs_spec[] = {"check", "emit", "compile", "plan"};
    int known = 0;
    for (size_t i = 0; i < sizeof needs_spec / sizeof *needs_spec; i++)
        known |= strcmp(a.cmd, needs_spec[i]) == 0;
    if (!known)
        return usage_error("unknown command '%s'", a.cmd);
    if (!a.spec)
        return usage_error("%s needs a SPEC file", a.cmd);
    static moe_tuning_t tuning; /* lives until exit: plans point into it */
    a.table = moe_tuning_default();
    const char *env_tuning = getenv("MOEGEN_TUNING");
    if (!a.tuning && env_tuning && *env_tuning)
        a.tuning = env_tuning;
    if (a.tuning) {
        moe_diag_t d;
        if (moe_tuning_load(&tuning, a.tuning, &d)) {
            fprintf(stderr, "%s%s\n", d.msg, a.tuning == env_tuning ? " (the tuning table MOEGEN_TUNING names)" : "");
            return 2;
        }
        a.table = &tuning;
    } else if (!a.table) {
        fprintf(stderr, "moegen: error: the embedded tuning table does not parse (a build error)\n");
        return 1;
    }
    char why[300];
    if (strcmp(a.cmd, "compile") == 0 && moe_nvrtc_env_check(why, sizeof why)) { /* bad input: nothing compiled */
        fprintf(stderr, "moegen: error: %s\n", why);
        return 2;
    }
    if (strcmp(a.cmd, "check") == 0)
        return cmd_check(&a);
    if (strcmp(a.cmd, "emit") == 0)
        return cmd_emit(&a, 0);
    if (strcmp(a.cmd, "compile") == 0)
        return cmd_emit(&a, 1);
    return cmd_plan(&a);
}
