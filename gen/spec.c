/* spec.c — load a spec file in a sandbox, apply --set overrides, and point
 * errors at the key's file and line; spec_check.c checks the values against
 * the schema (spec_schema.c). */
#include "spec.h"
#include "spec_impl.h"

#include "sandbox.h"
#include "util.h"

#include <ctype.h>
#include <lauxlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MEM_LIMIT (16u << 20)
#define SPEC_INSTR_LIMIT 1000000L
#define SPEC_TEXT_MAX (1u << 20)
#define SPEC_CHUNK "moegen-spec" /* the chunk name Lua's messages start with */

const char *moe_dtype_ctype(moe_dtype_t d) { return d == MOE_DTYPE_FP16 ? "__half" : "__nv_bfloat16"; }
int moe_spec_world(const moe_spec_t *s) {
    return s->mesh.size[MOE_AXIS_DP] * s->mesh.size[MOE_AXIS_FSDP] * s->mesh.size[MOE_AXIS_EP];
}

/* ---- locating a key ----------------------------------------------------- */

static int ovr_index(const moe_spec_ctx_t *c, moe_keyref_t k) {
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
static int top_end_line(moe_spec_ctx_t *c, const char *key) {
    int line = 0;
    lua_getfield(c->L, LUA_REGISTRYINDEX, "moegen_lines");
    if (lua_getfield(c->L, -1, key) == LUA_TNUMBER)
        line = (int)lua_tointeger(c->L, -1);
    lua_pop(c->L, 2);
    return line;
}

/* Line of a key in the file: a top-level key's statement starts at the last
 * line at or before its recorded end that reads "key ="; a nested key is the
 * first line from its parent's start that reads "key =". 0 if unknown. One
 * pass over the text up to the statement's end (a scan per line from the
 * top made a large spec's error take minutes). */
static int key_line(moe_spec_ctx_t *c, moe_keyref_t k) {
    const char *top = k.parent ? k.parent : k.key;
    int end = top_end_line(c, top);
    if (end <= 0)
        return 0;
    int start = end, l = 1;
    const char *at = NULL, *last = NULL; /* the start line's text, the end line's */
    for (const char *p = c->text; p && l <= end; l++) {
        last = p;
        if (line_has_key(p, top, 1)) {
            start = l;
            at = p;
        }
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    if (!at)
        at = last;
    if (!k.parent || !at)
        return start;
    l = start;
    for (const char *p = at; p && l <= end; l++) {
        if (line_has_key(p, k.key, 0))
            return l;
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    return start;
}

/* (spec_impl.h) */
void moe_spec_key_error(moe_spec_ctx_t *c, moe_keyref_t k, const char *fmt, ...) {
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
    else {
        int line = k.key ? key_line(c, k) : 1;
        snprintf(c->diag->msg, sizeof c->diag->msg, "%s:%d: error: %s", c->path, line > 0 ? line : 1, msg);
    }
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
static void lua_diag(moe_spec_ctx_t *c, const char *lmsg) {
    c->failed = 1;
    size_t n = strlen(SPEC_CHUNK);
    if (strncmp(lmsg, SPEC_CHUNK, n) == 0 && lmsg[n] == ':' && isdigit((unsigned char)lmsg[n + 1])) {
        const char *p = lmsg + n + 1, *line = p;
        while (isdigit((unsigned char)*p))
            p++;
        if (*p == ':') {
            int len = (int)(p - line);
            p++;
            while (*p == ' ')
                p++;
            snprintf(c->diag->msg, sizeof c->diag->msg, "%s:%.*s: error: %s", c->path, len, line, p);
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
static int apply_override(moe_spec_ctx_t *c, int i) {
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
        lua_pushstring(L, key);
        if (lua_rawget(L, envi) != LUA_TTABLE) { /* raw, as the validation reads: no metamethod runs */
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushstring(L, key);
            lua_pushvalue(L, -2);
            lua_rawset(L, envi);
        }
        lua_pushstring(L, dot + 1);
        push_override_value(L, eq + 1);
        lua_rawset(L, -3);
        lua_pop(L, 1);
    } else {
        push_override_value(L, eq + 1);
        lua_setfield(L, envi, key);
    }
    return 0;
}

/* The line of the spec's last `return` statement (a line that starts with
 * the word), or 1. */
static int return_line(const char *text) {
    int line = 1, at = 1;
    for (const char *p = text; *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "return", 6) == 0 && !isalnum((unsigned char)p[6]) && p[6] != '_')
            at = line;
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        p = nl + 1;
        line++;
    }
    return at;
}

/* Where the spec set each top-level key (the lines spec_newindex kept),
 * the command line's --set after them, into spec->set_at. */
static void record_lines(lua_State *L, const moe_spec_ctx_t *c, moe_spec_t *spec) {
    const int cap = (int)(sizeof spec->set_at / sizeof *spec->set_at);
    spec->nset_at = 0;
    lua_getfield(L, LUA_REGISTRYINDEX, "moegen_lines");
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_isinteger(L, -1) && spec->nset_at < cap) {
            snprintf(spec->set_at[spec->nset_at].key, sizeof spec->set_at[0].key, "%s", lua_tostring(L, -2));
            spec->set_at[spec->nset_at++].line = (int)lua_tointeger(L, -1);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    for (int i = 0; i < c->novr; i++) { /* a --set wins over the file's line */
        const char *t = c->ovr[i].text;
        size_t kn = strcspn(t, ".=");
        int j = 0;
        while (j < spec->nset_at && !(strlen(spec->set_at[j].key) == kn && !strncmp(spec->set_at[j].key, t, kn)))
            j++;
        if (j == spec->nset_at) {
            if (j == cap || kn >= sizeof spec->set_at[0].key)
                continue;
            snprintf(spec->set_at[j].key, sizeof spec->set_at[0].key, "%.*s", (int)kn, t);
            spec->nset_at++;
        }
        spec->set_at[j].line = -(i + 1);
    }
}

void moe_spec_error_at(const moe_spec_t *s, const char *path, const char *err, char *out, size_t n) {
    for (int i = 0; i < s->nset_at; i++) {
        size_t kn = strlen(s->set_at[i].key);
        if (strncmp(err, s->set_at[i].key, kn) != 0 || (err[kn] != ' ' && err[kn] != ':'))
            continue;
        if (s->set_at[i].line < 0)
            snprintf(out, n, "<command line>:%d: error: %s", -s->set_at[i].line, err);
        else
            snprintf(out, n, "%s:%d: error: %s", path, s->set_at[i].line, err);
        return;
    }
    snprintf(out, n, "%s: error: %s", path, err);
}

/* The overrides and the validation, under lua_pcall (read_values's
 * arguments: the context and the spec as light userdata): they read only
 * raw and refuse tables with metatables, and anything that still raises
 * (memory the spec left exhausted) becomes an error, not a panic. */
static int read_values(lua_State *L) {
    moe_spec_ctx_t *c = lua_touserdata(L, 1);
    moe_spec_t *spec = lua_touserdata(L, 2);
    lua_settop(L, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, "moegen_values");
    for (int i = 0; i < c->novr && !c->failed; i++)
        apply_override(c, i);
    if (!c->failed)
        moe_spec_read(c, spec); /* clears spec, so the lines are recorded after it */
    if (!c->failed)
        record_lines(L, c, spec);
    return 0;
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
        if (strlen(owned) != n) { /* Lua would read past it, C string handling stop at it */
            int line = 1;
            for (const char *q = owned; *q; q++)
                line += *q == '\n';
            snprintf(diag->msg, sizeof diag->msg, "%s:%d: error: the spec holds a NUL byte; a spec is text", path,
                     line);
            free(owned);
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
    moe_spec_ctx_t c = {path, text, L, diag, ovr, novr, 0};
    /* a short chunk name: Lua truncates long ones (LUA_IDSIZE), which lost
     * the line of an error in a spec with a long path; lua_diag puts the
     * path back */
    const char *chunkname = "=" SPEC_CHUNK;
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
        if (moe_sandbox_pcall(L, 0, 1, 0) != LUA_OK) {
            const char *m = lua_tostring(L, -1);
            lua_diag(&c, m ? m : "error while reading the spec");
        } else if (!lua_isnil(L, -1)) { /* `return { experts = 8, ... }`: read as no keys at all */
            snprintf(diag->msg, sizeof diag->msg, "%s:%d: error: the spec returns a value (%s); a spec is a list of "
                     "assignments, key = value, read as they are made: write experts = 8, not return { experts = 8 }",
                     path, return_line(text), luaL_typename(L, -1));
            c.failed = 1;
        } else {
            lua_settop(L, 0);
            lua_pushcfunction(L, read_values);
            lua_pushlightuserdata(L, &c);
            lua_pushlightuserdata(L, spec);
            if (moe_sandbox_pcall(L, 2, 0, 0) != LUA_OK && !c.failed) {
                const char *m = lua_tostring(L, -1);
                lua_diag(&c, m ? m : "error while reading the spec");
            }
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
    moe_hash_hex(canon, strlen(canon), spec->hash);
    free(canon);
    return 0;
}
