/* spec.c — load a spec file in a sandbox, validate it, canonicalize it. */
#include "spec.h"

#include "sandbox.h"
#include "util.h"

#include <ctype.h>
#include <lauxlib.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define SPEC_MEM_LIMIT (16u << 20)
#define SPEC_INSTR_LIMIT 1000000L
#define SPEC_TEXT_MAX (1u << 20)

/* Size limits that keep every size computation in range: row counts and
 * offsets fit int32, tensor element counts fit comfortably in int64. */
#define LIMIT_EXPERTS 4096
#define LIMIT_TOP_K 32
#define LIMIT_DIM 65536
#define LIMIT_TOKENS (1 << 20)
#define LIMIT_ROWS (1LL << 28)        /* tokens * top_k */
#define LIMIT_WEIGHT_ELEMS (1LL << 40) /* experts * 2F * H */
#define LIMIT_AXIS 4096
#define LIMIT_WORLD 65536

const char *moe_dtype_name(moe_dtype_t d) { return d == MOE_DTYPE_FP16 ? "fp16" : "bf16"; }
const char *moe_dtype_ctype(moe_dtype_t d) { return d == MOE_DTYPE_FP16 ? "__half" : "__nv_bfloat16"; }
const char *moe_arch_name(moe_arch_t a) { return a == MOE_ARCH_SM80 ? "sm_80" : "sm_90a"; }
const char *moe_axis_name(int axis) {
    static const char *const names[] = {"dp", "fsdp", "ep"};
    return axis >= 0 && axis < MOE_AXIS_COUNT ? names[axis] : "?";
}
int moe_spec_world(const moe_spec_t *s) {
    return s->mesh.size[MOE_AXIS_DP] * s->mesh.size[MOE_AXIS_FSDP] * s->mesh.size[MOE_AXIS_EP];
}

/* ---- loading context ---------------------------------------------------- */

typedef struct {
    const char *path;          /* file name for messages */
    const char *text;          /* the spec text, for locating nested keys */
    lua_State *L;
    moe_diag_t *diag;
    const moe_override_t *ovr;
    int novr;
    int failed;
} ctx_t;

/* Where a key came from: the override that set it, else its line. */
typedef struct {
    const char *parent;  /* NULL for top-level */
    const char *key;
} keyref_t;

static int ovr_index(const ctx_t *c, keyref_t k) {
    char full[128];
    if (k.parent)
        snprintf(full, sizeof full, "%s.%s", k.parent, k.key);
    else
        snprintf(full, sizeof full, "%s", k.key);
    size_t n = strlen(full);
    for (int i = c->novr - 1; i >= 0; i--) {
        const char *t = c->ovr[i].text;
        if (strncmp(t, full, n) == 0 && t[n] == '=')
            return i;
        /* overriding a whole table also covers its keys */
        if (k.parent && strncmp(t, k.parent, strlen(k.parent)) == 0 && t[strlen(k.parent)] == '=')
            return i;
    }
    return -1;
}

/* Line of the line-th line's start in text, or NULL. */
static const char *line_start(const char *text, int line) {
    const char *p = text;
    for (int l = 1; l < line && p; l++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return p;
}

/* Does the line at p hold "key =" (key as a whole word, not "key =="). */
static int line_has_key(const char *p, const char *key, int at_start) {
    size_t n = strlen(key);
    const char *end = strchr(p, '\n');
    if (!end)
        end = p + strlen(p);
    for (const char *q = p; q + 1 < end; q++)
        if (q[0] == '-' && q[1] == '-') {
            end = q; /* a comment is not an assignment */
            break;
        }
    for (const char *q = p; q + n <= end; q++) {
        if (at_start && q != p) {
            /* only leading whitespace may precede a top-level key */
            if (!isspace((unsigned char)q[-1]))
                break;
        }
        if (strncmp(q, key, n) != 0)
            continue;
        if (q > p && (isalnum((unsigned char)q[-1]) || q[-1] == '_'))
            continue;
        const char *r = q + n;
        while (r < end && (*r == ' ' || *r == '\t'))
            r++;
        if (r < end && *r == '=' && (r + 1 >= end || r[1] != '='))
            return 1;
    }
    return 0;
}

/* The recorded line of a top-level assignment (the line where it ends). */
static int top_end_line(ctx_t *c, const char *key) {
    int line = 0;
    lua_getfield(c->L, LUA_REGISTRYINDEX, "moegen_lines");
    if (lua_getfield(c->L, -1, key) == LUA_TNUMBER)
        line = (int)lua_tointeger(c->L, -1);
    lua_pop(c->L, 2);
    return line;
}

/* Line of a key in the file: a top-level key's statement starts at the last
 * line at or before its recorded end that reads "key ="; a nested key is the
 * first line from its parent's start that reads "key =". 0 if unknown. */
static int key_line(ctx_t *c, keyref_t k) {
    const char *top = k.parent ? k.parent : k.key;
    int end = top_end_line(c, top);
    if (end <= 0)
        return 0;
    int start = end;
    for (int l = end; l >= 1; l--) {
        const char *p = line_start(c->text, l);
        if (p && line_has_key(p, top, 1)) {
            start = l;
            break;
        }
    }
    if (!k.parent)
        return start;
    for (int l = start; l <= end; l++) {
        const char *p = line_start(c->text, l);
        if (p && line_has_key(p, k.key, 0))
            return l;
    }
    return start;
}

/* Record "FILE:LINE: error: MESSAGE" for key k; the first error wins. */
static void key_error(ctx_t *c, keyref_t k, const char *fmt, ...) {
    if (c->failed)
        return;
    c->failed = 1;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int oi = ovr_index(c, k);
    if (oi >= 0)
        snprintf(c->diag->msg, sizeof c->diag->msg, "<command line>:%d: error: --set %s: %s", oi + 1,
                 c->ovr[oi].text, msg);
    else
        snprintf(c->diag->msg, sizeof c->diag->msg, "%s:%d: error: %s", c->path,
                 k.key ? (key_line(c, k) > 0 ? key_line(c, k) : 1) : 1, msg);
}

/* ---- the sandboxed chunk ------------------------------------------------ */

/* __newindex of the spec's environment (which stays empty, so every
 * assignment comes here): records the line of each top-level assignment,
 * refuses a key set twice, and stores the value in the values table. */
static int spec_newindex(lua_State *L) {
    lua_Debug ar;
    int line = 0;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "l", &ar))
        line = ar.currentline;
    if (lua_type(L, 2) != LUA_TSTRING)
        return luaL_error(L, "spec keys must be names");
    lua_getfield(L, LUA_REGISTRYINDEX, "moegen_lines");
    if (lua_getfield(L, -1, lua_tostring(L, 2)) != LUA_TNIL)
        return luaL_error(L, "key '%s' is set twice (first on line %d)", lua_tostring(L, 2),
                          (int)lua_tointeger(L, -1));
    lua_pop(L, 1);
    lua_pushinteger(L, line);
    lua_setfield(L, -2, lua_tostring(L, 2));
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "moegen_values");
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_rawset(L, -3);
    return 0;
}

/* __index of the environment: reading a key already set gives its value;
 * any other name is an error (a spec has no variables, so `ture` or an
 * unquoted string would otherwise read as nil). */
static int spec_index(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, "moegen_values");
    lua_pushvalue(L, 2);
    if (lua_rawget(L, -2) == LUA_TNIL && lua_type(L, 2) == LUA_TSTRING)
        return luaL_error(L, "'%s' is not defined (strings need quotes; booleans are true and false)",
                          lua_tostring(L, 2));
    return 1;
}

/* Turn Lua's "path:LINE: message" into "path:LINE: error: message". */
static void lua_diag(ctx_t *c, const char *lmsg) {
    c->failed = 1;
    size_t n = strlen(c->path);
    if (strncmp(lmsg, c->path, n) == 0 && lmsg[n] == ':' && isdigit((unsigned char)lmsg[n + 1])) {
        const char *p = lmsg + n + 1;
        while (isdigit((unsigned char)*p))
            p++;
        if (*p == ':') {
            p++;
            while (*p == ' ')
                p++;
            snprintf(c->diag->msg, sizeof c->diag->msg, "%.*s: error: %s", (int)(p - lmsg - 2), lmsg, p);
            return;
        }
    }
    snprintf(c->diag->msg, sizeof c->diag->msg, "%s:1: error: %s", c->path,
             strcmp(lmsg, "not enough memory") == 0 ? "the spec exceeds the memory limit (16 MiB)" : lmsg);
}

/* Parse one override value into a Lua value pushed on the stack: integer,
 * number, true/false, a {...} list of names or numbers, or a string. */
static int push_override_value(lua_State *L, const char *v) {
    char *end;
    if (*v) {
        long long iv = strtoll(v, &end, 10);
        if (*end == '\0') {
            lua_pushinteger(L, iv);
            return 0;
        }
        double dv = strtod(v, &end);
        if (*end == '\0') {
            lua_pushnumber(L, dv);
            return 0;
        }
    }
    if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
        lua_pushboolean(L, v[0] == 't');
        return 0;
    }
    if (strchr(v, ',') || v[0] == '{') {
        /* a list: a,b,c or {a,b,c}; items are strings */
        lua_newtable(L);
        const char *p = v + (v[0] == '{');
        int i = 1;
        while (*p && *p != '}') {
            while (*p == ' ' || *p == '"')
                p++;
            const char *q = p;
            while (*q && *q != ',' && *q != '}' && *q != '"' && *q != ' ')
                q++;
            if (q > p) {
                lua_pushlstring(L, p, (size_t)(q - p));
                lua_rawseti(L, -2, i++);
            }
            p = q;
            while (*p == ' ' || *p == '"' || *p == ',')
                p++;
        }
        return 0;
    }
    lua_pushstring(L, v);
    return 0;
}

/* Apply "key=value" / "parent.key=value" to the table at the stack top. */
static int apply_override(ctx_t *c, int i) {
    lua_State *L = c->L;
    const char *t = c->ovr[i].text;
    const char *eq = strchr(t, '=');
    if (!eq || eq == t) {
        snprintf(c->diag->msg, sizeof c->diag->msg,
                 "<command line>:%d: error: --set '%s' is not of the form key=value", i + 1, t);
        return c->failed = 1;
    }
    char key[128];
    size_t kn = (size_t)(eq - t);
    if (kn >= sizeof key)
        kn = sizeof key - 1;
    memcpy(key, t, kn);
    key[kn] = '\0';
    char *dot = strchr(key, '.');
    int envi = lua_gettop(L);
    if (dot) {
        *dot = '\0';
        if (lua_getfield(L, envi, key) != LUA_TTABLE) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, -1);
            lua_setfield(L, envi, key);
        }
        push_override_value(L, eq + 1);
        lua_setfield(L, -2, dot + 1);
        lua_pop(L, 1);
    } else {
        push_override_value(L, eq + 1);
        lua_setfield(L, envi, key);
    }
    return 0;
}

/* ---- typed getters ------------------------------------------------------ */

static const char *type_word(lua_State *L, int idx) {
    int t = lua_type(L, idx);
    if (t == LUA_TNUMBER)
        return lua_isinteger(L, idx) ? "an integer" : "a number";
    if (t == LUA_TSTRING)
        return "a string";
    if (t == LUA_TBOOLEAN)
        return "a boolean";
    if (t == LUA_TTABLE)
        return "a table";
    return lua_typename(L, t);
}

/* Edit distance, for "did you mean". */
static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    int d[41][41];
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

/* Refuse keys of the table at idx that are not in `known`. */
static void check_keys(ctx_t *c, int idx, const char *parent, const char *const *known) {
    lua_State *L = c->L;
    lua_pushnil(L);
    while (!c->failed && lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            key_error(c, (keyref_t){NULL, parent}, "%s: keys must be names, not %s", parent ? parent : "spec",
                      type_word(L, -1));
            lua_pop(L, 1);
            return;
        }
        const char *key = lua_tostring(L, -1);
        int found = 0, best = 99;
        const char *near = NULL;
        for (const char *const *k = known; *k; k++) {
            if (strcmp(*k, key) == 0) {
                found = 1;
                break;
            }
            int d = edit_distance(*k, key);
            if (d < best) {
                best = d;
                near = *k;
            }
        }
        if (!found) {
            char full[160];
            snprintf(full, sizeof full, "%s%s%s", parent ? parent : "", parent ? "." : "", key);
            if (near && best <= 2)
                key_error(c, (keyref_t){parent, key}, "unknown key '%s' (did you mean '%s%s%s'?)", full,
                          parent ? parent : "", parent ? "." : "", near);
            else
                key_error(c, (keyref_t){parent, key}, "unknown key '%s'", full);
        }
    }
    if (c->failed)
        lua_settop(L, idx);
}

static char *full_name(char *buf, size_t n, keyref_t k) {
    snprintf(buf, n, "%s%s%s", k.parent ? k.parent : "", k.parent ? "." : "", k.key);
    return buf;
}

/* Fetch an integer key from the table at idx into *out, with range [lo, hi].
 * Missing: default when !required. */
static void get_int(ctx_t *c, int idx, keyref_t k, int required, int def, long long lo, long long hi, int *out) {
    if (c->failed)
        return;
    lua_State *L = c->L;
    char fn[128];
    int t = lua_getfield(L, idx, k.key);
    if (t == LUA_TNIL) {
        if (required)
            key_error(c, (keyref_t){NULL, NULL}, "missing required key '%s'", full_name(fn, sizeof fn, k));
        *out = def;
    } else if (!lua_isinteger(L, -1)) {
        if (t == LUA_TNUMBER)
            key_error(c, k, "%s must be an integer, got %.17g%s", full_name(fn, sizeof fn, k), lua_tonumber(L, -1),
                      lua_tonumber(L, -1) == (double)(long long)lua_tonumber(L, -1) ? ".0" : "");
        else
            key_error(c, k, "%s must be an integer, got %s", full_name(fn, sizeof fn, k), type_word(L, -1));
    } else {
        long long v = lua_tointeger(L, -1);
        if (v < lo || v > hi)
            key_error(c, k, "%s = %lld is out of range [%lld, %lld]", full_name(fn, sizeof fn, k), v, lo, hi);
        else
            *out = (int)v;
    }
    lua_pop(L, 1);
}

static void get_num(ctx_t *c, int idx, keyref_t k, double def, double lo, double hi, double *out, int *present) {
    if (c->failed)
        return;
    lua_State *L = c->L;
    char fn[128];
    int t = lua_getfield(L, idx, k.key);
    if (present)
        *present = t != LUA_TNIL;
    if (t == LUA_TNIL) {
        *out = def;
    } else if (t != LUA_TNUMBER) {
        key_error(c, k, "%s must be a number, got %s", full_name(fn, sizeof fn, k), type_word(L, -1));
    } else {
        double v = lua_tonumber(L, -1);
        if (!(v >= lo && v <= hi))
            key_error(c, k, "%s = %g is out of range [%g, %g]", full_name(fn, sizeof fn, k), v, lo, hi);
        else
            *out = v;
    }
    lua_pop(L, 1);
}

static void get_bool(ctx_t *c, int idx, keyref_t k, bool def, bool *out) {
    if (c->failed)
        return;
    lua_State *L = c->L;
    char fn[128];
    int t = lua_getfield(L, idx, k.key);
    if (t == LUA_TNIL)
        *out = def;
    else if (t != LUA_TBOOLEAN)
        key_error(c, k, "%s must be true or false, got %s", full_name(fn, sizeof fn, k), type_word(L, -1));
    else
        *out = lua_toboolean(L, -1);
    lua_pop(L, 1);
}

/* A string key that must be one of choices[]; *out gets its index. */
static void get_enum(ctx_t *c, int idx, keyref_t k, int def, const char *const *choices, int *out) {
    if (c->failed)
        return;
    lua_State *L = c->L;
    char fn[128];
    int t = lua_getfield(L, idx, k.key);
    if (t == LUA_TNIL) {
        *out = def;
    } else if (t != LUA_TSTRING) {
        key_error(c, k, "%s must be a string, got %s", full_name(fn, sizeof fn, k), type_word(L, -1));
    } else {
        const char *v = lua_tostring(L, -1);
        int i = 0;
        for (; choices[i]; i++)
            if (strcmp(choices[i], v) == 0)
                break;
        if (choices[i]) {
            *out = i;
        } else {
            char list[256] = "";
            for (int j = 0; choices[j]; j++) {
                strncat(list, j ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, "\"", sizeof list - strlen(list) - 1);
                strncat(list, choices[j], sizeof list - strlen(list) - 1);
                strncat(list, "\"", sizeof list - strlen(list) - 1);
            }
            key_error(c, k, "%s = \"%s\" is not one of %s", full_name(fn, sizeof fn, k), v, list);
        }
    }
    lua_pop(L, 1);
}

/* A list of strings from choices[] (a single string counts as a list of
 * one); no repeats. Writes indices to out[], returns the count. */
static int get_enum_list(ctx_t *c, int idx, keyref_t k, const char *const *choices, int *out, int max) {
    if (c->failed)
        return 0;
    lua_State *L = c->L;
    char fn[128];
    full_name(fn, sizeof fn, k);
    int t = lua_getfield(L, idx, k.key);
    int n = 0;
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return -1;
    }
    if (t == LUA_TSTRING) {
        lua_newtable(L);
        lua_insert(L, -2);
        lua_rawseti(L, -2, 1);
    } else if (t != LUA_TTABLE) {
        key_error(c, k, "%s must be a list of strings, got %s", fn, type_word(L, -1));
        lua_pop(L, 1);
        return 0;
    }
    int len = (int)luaL_len(L, -1);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > len) {
            key_error(c, k, "%s must be a list of strings (no named keys)", fn);
            lua_pop(L, 2);
            return 0;
        }
    }
    if (len == 0 || len > max) {
        key_error(c, k, "%s must list 1 to %d items, got %d", fn, max, len);
        lua_pop(L, 1);
        return 0;
    }
    for (int i = 1; i <= len && !c->failed; i++) {
        lua_rawgeti(L, -1, i);
        if (lua_type(L, -1) != LUA_TSTRING) {
            key_error(c, k, "%s[%d] must be a string, got %s", fn, i, type_word(L, -1));
        } else {
            const char *v = lua_tostring(L, -1);
            int j = 0;
            for (; choices[j]; j++)
                if (strcmp(choices[j], v) == 0)
                    break;
            if (!choices[j])
                key_error(c, k, "%s[%d] = \"%s\" is not a known value", fn, i, v);
            for (int m = 0; m < n && !c->failed; m++)
                if (out[m] == j)
                    key_error(c, k, "%s lists \"%s\" twice", fn, v);
            out[n++] = j;
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return n;
}

/* Push the sub-table at key (or an empty table when absent). */
static int get_table(ctx_t *c, int idx, keyref_t k) {
    lua_State *L = c->L;
    int t = lua_getfield(L, idx, k.key);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
    } else if (t != LUA_TTABLE) {
        key_error(c, k, "%s must be a table, got %s", k.key, type_word(L, -1));
    }
    return lua_gettop(L);
}

/* ---- validation --------------------------------------------------------- */

static void read_spec(ctx_t *c, moe_spec_t *s) {
    lua_State *L = c->L;
    int env = lua_gettop(L);
    static const char *const top_keys[] = {"name", "experts", "top_k", "hidden", "ffn", "tokens", "dtype",
                                           "router", "activation", "ffn_bias", "mesh", "dispatch", "arch", NULL};
    check_keys(c, env, NULL, top_keys);

    keyref_t kname = {NULL, "name"};
    if (!c->failed) {
        int t = lua_getfield(L, env, "name");
        if (t == LUA_TNIL)
            key_error(c, (keyref_t){NULL, NULL}, "missing required key 'name'");
        else if (t != LUA_TSTRING)
            key_error(c, kname, "name must be a string, got %s", type_word(L, -1));
        else {
            const char *v = lua_tostring(L, -1);
            size_t n = strlen(v);
            int ok = n > 0 && n < 48 && (isalpha((unsigned char)v[0]) || v[0] == '_');
            for (size_t i = 0; ok && i < n; i++)
                ok = isalnum((unsigned char)v[i]) || v[i] == '_';
            if (!ok)
                key_error(c, kname,
                          "name = \"%s\" must be a C identifier of at most 47 characters "
                          "(letters, digits, '_'; not starting with a digit)", v);
            else
                memcpy(s->name, v, n + 1);
        }
        lua_pop(L, 1);
    }
    get_int(c, env, (keyref_t){NULL, "experts"}, 1, 0, 1, LIMIT_EXPERTS, &s->experts);
    get_int(c, env, (keyref_t){NULL, "top_k"}, 1, 0, 1, LIMIT_TOP_K, &s->top_k);
    get_int(c, env, (keyref_t){NULL, "hidden"}, 1, 0, 8, LIMIT_DIM, &s->hidden);
    get_int(c, env, (keyref_t){NULL, "ffn"}, 1, 0, 8, LIMIT_DIM, &s->ffn);
    get_int(c, env, (keyref_t){NULL, "tokens"}, 0, 16384, 1, LIMIT_TOKENS, &s->tokens);
    static const char *const dtypes[] = {"bf16", "fp16", NULL};
    int dt = 0;
    get_enum(c, env, (keyref_t){NULL, "dtype"}, 0, dtypes, &dt);
    s->dtype = (moe_dtype_t)dt;
    get_bool(c, env, (keyref_t){NULL, "ffn_bias"}, false, &s->ffn_bias);

    /* router */
    if (!c->failed) {
        int r = get_table(c, env, (keyref_t){NULL, "router"});
        static const char *const rkeys[] = {"score", "renormalize", "groups", "topk_groups", "bias",
                                            "logit_bias", "scale", NULL};
        if (!c->failed)
            check_keys(c, r, "router", rkeys);
        static const char *const scores[] = {"softmax", "sigmoid", NULL};
        int sc = 0;
        get_enum(c, r, (keyref_t){"router", "score"}, 0, scores, &sc);
        s->router.score = (moe_score_t)sc;
        get_bool(c, r, (keyref_t){"router", "renormalize"}, true, &s->router.renormalize);
        get_int(c, r, (keyref_t){"router", "groups"}, 0, 1, 1, LIMIT_EXPERTS, &s->router.groups);
        get_int(c, r, (keyref_t){"router", "topk_groups"}, 0, 1, 1, LIMIT_EXPERTS, &s->router.topk_groups);
        get_bool(c, r, (keyref_t){"router", "bias"}, false, &s->router.bias);
        get_bool(c, r, (keyref_t){"router", "logit_bias"}, false, &s->router.logit_bias);
        get_num(c, r, (keyref_t){"router", "scale"}, 1.0, 1e-6, 1e6, &s->router.scale, NULL);
        lua_settop(L, env);
    }
    /* activation */
    if (!c->failed) {
        int a = get_table(c, env, (keyref_t){NULL, "activation"});
        static const char *const akeys[] = {"kind", "alpha", "limit", "up_offset", NULL};
        if (!c->failed)
            check_keys(c, a, "activation", akeys);
        static const char *const kinds[] = {"swiglu", NULL};
        int kind = 0;
        get_enum(c, a, (keyref_t){"activation", "kind"}, 0, kinds, &kind);
        get_num(c, a, (keyref_t){"activation", "alpha"}, 1.0, 1e-6, 1e6, &s->activation.alpha, NULL);
        int has_limit = 0;
        get_num(c, a, (keyref_t){"activation", "limit"}, 0.0, 1e-6, 1e6, &s->activation.limit, &has_limit);
        get_num(c, a, (keyref_t){"activation", "up_offset"}, 0.0, -1e6, 1e6, &s->activation.up_offset, NULL);
        lua_settop(L, env);
    }
    /* mesh */
    if (!c->failed) {
        int m = get_table(c, env, (keyref_t){NULL, "mesh"});
        static const char *const mkeys[] = {"dp", "fsdp", "ep", "order", "expert_sharding", NULL};
        if (!c->failed)
            check_keys(c, m, "mesh", mkeys);
        get_int(c, m, (keyref_t){"mesh", "dp"}, 0, 1, 1, LIMIT_AXIS, &s->mesh.size[MOE_AXIS_DP]);
        get_int(c, m, (keyref_t){"mesh", "fsdp"}, 0, 1, 1, LIMIT_AXIS, &s->mesh.size[MOE_AXIS_FSDP]);
        get_int(c, m, (keyref_t){"mesh", "ep"}, 0, 1, 1, LIMIT_AXIS, &s->mesh.size[MOE_AXIS_EP]);
        static const char *const axes[] = {"dp", "fsdp", "ep", NULL};
        int order[MOE_AXIS_COUNT];
        int n = get_enum_list(c, m, (keyref_t){"mesh", "order"}, axes, order, MOE_AXIS_COUNT);
        if (n < 0) {
            for (int i = 0; i < MOE_AXIS_COUNT; i++)
                s->mesh.order[i] = i;
        } else if (!c->failed && n != MOE_AXIS_COUNT) {
            key_error(c, (keyref_t){"mesh", "order"}, "mesh.order must list each of \"dp\", \"fsdp\", \"ep\" once");
        } else {
            memcpy(s->mesh.order, order, sizeof order);
        }
        int sh[2];
        n = get_enum_list(c, m, (keyref_t){"mesh", "expert_sharding"}, axes, sh, 2);
        if (n < 0) {
            s->mesh.nsharding = 2;
            s->mesh.sharding[0] = MOE_AXIS_EP;
            s->mesh.sharding[1] = MOE_AXIS_FSDP;
        } else if (!c->failed) {
            for (int i = 0; i < n; i++)
                if (sh[i] == MOE_AXIS_DP)
                    key_error(c, (keyref_t){"mesh", "expert_sharding"},
                              "mesh.expert_sharding may name \"ep\" and \"fsdp\" only, not \"dp\"");
            s->mesh.nsharding = n;
            memcpy(s->mesh.sharding, sh, sizeof(int) * (size_t)n);
        }
        lua_settop(L, env);
    }
    /* dispatch */
    if (!c->failed) {
        int d = get_table(c, env, (keyref_t){NULL, "dispatch"});
        static const char *const dkeys[] = {"mode", "capacity", NULL};
        if (!c->failed)
            check_keys(c, d, "dispatch", dkeys);
        static const char *const modes[] = {"exact", "capacity", NULL};
        int mode = 0;
        get_enum(c, d, (keyref_t){"dispatch", "mode"}, 0, modes, &mode);
        s->dispatch.mode = (moe_dispatch_mode_t)mode;
        get_int(c, d, (keyref_t){"dispatch", "capacity"}, 0, 0, 1, LIMIT_ROWS, &s->dispatch.capacity);
        if (!c->failed && mode == MOE_DISPATCH_CAPACITY && s->dispatch.capacity == 0)
            key_error(c, (keyref_t){"dispatch", "mode"},
                      "dispatch.mode = \"capacity\" needs dispatch.capacity, the most rows one rank sends to one "
                      "EP peer");
        if (!c->failed && mode == MOE_DISPATCH_EXACT && s->dispatch.capacity != 0)
            key_error(c, (keyref_t){"dispatch", "capacity"},
                      "dispatch.capacity applies to mode = \"capacity\" only (mode is \"exact\")");
        lua_settop(L, env);
    }
    /* arch */
    if (!c->failed) {
        static const char *const arches[] = {"sm_90a", "sm_80", NULL};
        int a[MOE_ARCH_MAX];
        int n = get_enum_list(c, env, (keyref_t){NULL, "arch"}, arches, a, 2);
        if (n < 0) {
            s->narch = 1;
            s->arch[0] = MOE_ARCH_SM90A;
        } else if (!c->failed) {
            s->narch = n;
            for (int i = 0; i < n; i++)
                s->arch[i] = (moe_arch_t)a[i];
        }
    }
    if (c->failed)
        return;

    /* relations between keys */
    const moe_router_t *r = &s->router;
    keyref_t ktopk = {NULL, "top_k"};
    if (s->top_k > s->experts)
        key_error(c, ktopk, "top_k (%d) must not exceed experts (%d)", s->top_k, s->experts);
    else if (s->hidden % 8)
        key_error(c, (keyref_t){NULL, "hidden"}, "hidden (%d) must be a multiple of 8", s->hidden);
    else if (s->ffn % 8)
        key_error(c, (keyref_t){NULL, "ffn"}, "ffn (%d) must be a multiple of 8", s->ffn);
    else if (s->experts % r->groups)
        key_error(c, (keyref_t){"router", "groups"}, "router.groups (%d) must divide experts (%d)", r->groups,
                  s->experts);
    else if (r->topk_groups > r->groups)
        key_error(c, (keyref_t){"router", "topk_groups"}, "router.topk_groups (%d) must not exceed router.groups (%d)",
                  r->topk_groups, r->groups);
    else if (r->groups > 1 && s->top_k % r->topk_groups)
        key_error(c, (keyref_t){"router", "topk_groups"},
                  "router.topk_groups (%d) must divide top_k (%d): a group's score sums its top top_k/topk_groups "
                  "experts", r->topk_groups, s->top_k);
    else if (r->groups > 1 && s->top_k > r->topk_groups * (s->experts / r->groups))
        key_error(c, (keyref_t){"router", "topk_groups"},
                  "top_k (%d) exceeds the experts in the kept groups (%d groups of %d)", s->top_k, r->topk_groups,
                  s->experts / r->groups);
    if (c->failed)
        return;
    long long rows = (long long)s->tokens * s->top_k;
    long long welems = (long long)s->experts * 2 * s->ffn * s->hidden;
    if (rows > LIMIT_ROWS)
        key_error(c, (keyref_t){NULL, "tokens"}, "tokens * top_k (%lld) exceeds the limit of %lld rows", rows,
                  LIMIT_ROWS);
    else if (welems > LIMIT_WEIGHT_ELEMS)
        key_error(c, (keyref_t){NULL, "experts"}, "experts * 2 * ffn * hidden (%lld) exceeds the limit of %lld "
                  "weight elements", welems, LIMIT_WEIGHT_ELEMS);
    if (c->failed)
        return;
    long long world = (long long)s->mesh.size[0] * s->mesh.size[1] * s->mesh.size[2];
    int shard = 1;
    for (int i = 0; i < s->mesh.nsharding; i++)
        shard *= s->mesh.size[s->mesh.sharding[i]];
    if (world > LIMIT_WORLD)
        key_error(c, (keyref_t){NULL, "mesh"}, "the mesh has %lld devices, more than the limit of %d", world,
                  LIMIT_WORLD);
    else if (s->experts % shard)
        key_error(c, (keyref_t){NULL, "experts"},
                  "experts (%d) must be divisible by the product of the expert_sharding axes (%d)", s->experts,
                  shard);
    else if (s->experts % s->mesh.size[MOE_AXIS_EP])
        key_error(c, (keyref_t){NULL, "experts"}, "experts (%d) must be divisible by mesh.ep (%d)", s->experts,
                  s->mesh.size[MOE_AXIS_EP]);
    if (s->mesh.size[MOE_AXIS_EP] == 1) /* nothing is dispatched: the key has no effect */
        s->dispatch = (moe_dispatch_t){MOE_DISPATCH_EXACT, 0};
}

int moe_spec_load(moe_spec_t *spec, const char *path, const char *text, const moe_override_t *ovr, int novr,
                  moe_diag_t *diag) {
    memset(spec, 0, sizeof *spec);
    diag->msg[0] = '\0';
    char *owned = NULL;
    if (!text) {
        size_t n;
        char err[256];
        owned = moe_read_file(path, SPEC_TEXT_MAX, &n, err, sizeof err);
        if (!owned) {
            snprintf(diag->msg, sizeof diag->msg, "%s:1: error: %s", path, err);
            return 1;
        }
        text = owned;
    }
    moe_sandbox_t sb;
    lua_State *L = moe_sandbox_new(&sb, SPEC_MEM_LIMIT, SPEC_INSTR_LIMIT, 0);
    if (!L) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: cannot create the Lua state", path);
        free(owned);
        return 1;
    }
    ctx_t c = {path, text, L, diag, ovr, novr, 0};
    char chunkname[512];
    snprintf(chunkname, sizeof chunkname, "@%s", path);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "moegen_lines");
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "moegen_values");
    if (luaL_loadbufferx(L, text, strlen(text), chunkname, "t") != LUA_OK) {
        lua_diag(&c, lua_tostring(L, -1));
    } else {
        /* env: empty table; a metatable records lines of assignments */
        lua_newtable(L);
        lua_newtable(L);
        lua_pushcfunction(L, spec_newindex);
        lua_setfield(L, -2, "__newindex");
        lua_pushcfunction(L, spec_index);
        lua_setfield(L, -2, "__index");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_insert(L, 1); /* env at 1, chunk at 3 */
        lua_setupvalue(L, -2, 1);
        if (moe_sandbox_pcall(L, 0, 0, 0) != LUA_OK) {
            const char *m = lua_tostring(L, -1);
            lua_diag(&c, m ? m : "error while reading the spec");
        } else {
            lua_settop(L, 0);
            lua_getfield(L, LUA_REGISTRYINDEX, "moegen_values");
            for (int i = 0; i < novr && !c.failed; i++)
                apply_override(&c, i);
            if (!c.failed)
                read_spec(&c, spec);
        }
    }
    lua_close(L);
    free(owned);
    if (c.failed)
        return 1;
    char *canon = moe_spec_canonical(spec);
    if (!canon) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: out of memory", path);
        return 1;
    }
    XXH128_hash_t h = XXH3_128bits(canon, strlen(canon));
    snprintf(spec->hash, sizeof spec->hash, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    free(canon);
    return 0;
}

/* Shortest "%.Ng" that reads back to v. */
static void fmt_num(char *buf, size_t n, double v) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

char *moe_spec_canonical(const moe_spec_t *s) {
    moe_buf_t b = {0};
    char n1[32], n2[32], n3[32];
    fmt_num(n1, sizeof n1, s->activation.alpha);
    fmt_num(n3, sizeof n3, s->activation.up_offset);
    moe_buf_printf(&b, "activation = { alpha = %s, kind = \"swiglu\"", n1);
    if (s->activation.limit > 0) {
        fmt_num(n2, sizeof n2, s->activation.limit);
        moe_buf_printf(&b, ", limit = %s", n2);
    }
    moe_buf_printf(&b, ", up_offset = %s }\n", n3);
    moe_buf_printf(&b, "arch = {");
    for (int i = 0; i < s->narch; i++)
        moe_buf_printf(&b, "%s \"%s\"", i ? "," : "", moe_arch_name(s->arch[i]));
    moe_buf_printf(&b, " }\n");
    /* dispatch only matters, and is only written, when experts move between ranks */
    if (s->mesh.size[MOE_AXIS_EP] > 1) {
        if (s->dispatch.mode == MOE_DISPATCH_CAPACITY)
            moe_buf_printf(&b, "dispatch = { capacity = %d, mode = \"capacity\" }\n", s->dispatch.capacity);
        else
            moe_buf_printf(&b, "dispatch = { mode = \"exact\" }\n");
    }
    moe_buf_printf(&b, "dtype = \"%s\"\n", moe_dtype_name(s->dtype));
    moe_buf_printf(&b, "experts = %d\n", s->experts);
    moe_buf_printf(&b, "ffn = %d\n", s->ffn);
    moe_buf_printf(&b, "ffn_bias = %s\n", s->ffn_bias ? "true" : "false");
    moe_buf_printf(&b, "hidden = %d\n", s->hidden);
    moe_buf_printf(&b, "mesh = { dp = %d, ep = %d, expert_sharding = {", s->mesh.size[MOE_AXIS_DP],
                   s->mesh.size[MOE_AXIS_EP]);
    for (int i = 0; i < s->mesh.nsharding; i++)
        moe_buf_printf(&b, "%s \"%s\"", i ? "," : "", moe_axis_name(s->mesh.sharding[i]));
    moe_buf_printf(&b, " }, fsdp = %d, order = {", s->mesh.size[MOE_AXIS_FSDP]);
    for (int i = 0; i < MOE_AXIS_COUNT; i++)
        moe_buf_printf(&b, "%s \"%s\"", i ? "," : "", moe_axis_name(s->mesh.order[i]));
    moe_buf_printf(&b, " } }\n");
    moe_buf_printf(&b, "name = \"%s\"\n", s->name);
    fmt_num(n1, sizeof n1, s->router.scale);
    moe_buf_printf(&b,
                   "router = { bias = %s, groups = %d, logit_bias = %s, renormalize = %s, scale = %s, "
                   "score = \"%s\", topk_groups = %d }\n",
                   s->router.bias ? "true" : "false", s->router.groups, s->router.logit_bias ? "true" : "false",
                   s->router.renormalize ? "true" : "false", n1,
                   s->router.score == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax", s->router.topk_groups);
    moe_buf_printf(&b, "tokens = %d\n", s->tokens);
    moe_buf_printf(&b, "top_k = %d\n", s->top_k);
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}
