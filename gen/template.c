/* template.c — translate templates to Lua chunks and run them. */
#define _POSIX_C_SOURCE 200809L
#include "template.h"

#include "sandbox.h"

#include <ctype.h>
#include <dirent.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TMPL_MEM_LIMIT (256u << 20)
#define TMPL_INSTR_LIMIT 200000000L
#define TMPL_OUT_LIMIT (256u << 20) /* bytes one expansion may write (C memory, outside the Lua limit) */

struct moe_tmpl {
    char *dir;              /* NULL = embedded */
    moe_sandbox_t sb;
    lua_State *L;
    moe_buf_t *out;         /* where __out appends, during an expansion */
    const char *last_file;  /* file of the last emitted line (interned in Lua) */
    int last_line;
    char err[1024];
};

lua_State *moe_tmpl_lua(moe_tmpl_t *t) { return t->L; }

/* Template source for name, from the override folder or the embedding.
 * Sets *display to the repo-relative (or override) path. Malloc'd. */
static char *tmpl_source(moe_tmpl_t *t, const char *name, char *display, size_t dn, char *err, size_t errlen) {
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s.lua", name);
    if (t->dir) { /* a file of the folder itself: not a link out of it */
        snprintf(display, dn, "%s/%s.lua", t->dir, name);
        return moe_read_regular(display, 4u << 20, NULL, MOE_READ_NOFOLLOW, err, errlen);
    }
    snprintf(display, dn, "%s", rel);
    for (size_t i = 0; i < moe_embedded_templates_count; i++)
        if (strcmp(moe_embedded_templates[i].path, rel) == 0) {
            char *s = malloc(moe_embedded_templates[i].len + 1);
            if (!s) {
                snprintf(err, errlen, "out of memory");
                return NULL;
            }
            memcpy(s, moe_embedded_templates[i].text, moe_embedded_templates[i].len);
            s[moe_embedded_templates[i].len] = '\0';
            return s;
        }
    snprintf(err, errlen, "no template '%s'", rel);
    return NULL;
}

/* Append s as a Lua quoted string literal. */
static void lua_quote(moe_buf_t *b, const char *s, size_t n) {
    moe_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            moe_buf_append(b, e, 2);
        } else if (c < 32 || c == 127) {
            moe_buf_printf(b, "\\%03u", c);
        } else {
            moe_buf_append(b, (const char *)&c, 1);
        }
    }
    moe_buf_append(b, "\"", 1);
}

/* Translate template text into a Lua chunk, one chunk line per template
 * line. Returns 0, or the 1-based line of an unclosed ${ with err set. */
static int translate(const char *src, moe_buf_t *lua, char *err, size_t errlen) {
    int line = 1;
    const char *p = src;
    while (*p) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *q = p;
        while (q < p + n && (*q == ' ' || *q == '\t'))
            q++;
        if (q < p + n && *q == '@') {
            moe_buf_append(lua, q + 1, n - (size_t)(q + 1 - p));
        } else {
            /* ';' first: a text line never continues the Lua statement of
             * the '@' line above it (`@ local x =` took the output call as
             * its value, silently) */
            moe_buf_printf(lua, ";__out(%d", line);
            const char *s = p, *lim = p + n;
            while (s < lim) {
                const char *d = s;
                while (d + 1 < lim && !(d[0] == '$' && d[1] == '{'))
                    d++;
                if (d + 1 >= lim)
                    d = lim;
                if (d > s) {
                    moe_buf_append(lua, ", ", 2);
                    lua_quote(lua, s, (size_t)(d - s));
                }
                if (d >= lim)
                    break;
                /* ${ expr }, braces balanced */
                const char *e = d + 2;
                int depth = 1;
                while (e < lim && depth) {
                    if (*e == '{')
                        depth++;
                    else if (*e == '}')
                        depth--;
                    if (depth)
                        e++;
                }
                if (e >= lim) {
                    snprintf(err, errlen, "unclosed ${ in template line");
                    return line;
                }
                moe_buf_append(lua, ", __s(", 6);
                moe_buf_append(lua, d + 2, (size_t)(e - d - 2));
                moe_buf_append(lua, ")", 1);
                s = e + 1;
            }
            moe_buf_append(lua, ")", 1);
        }
        moe_buf_append(lua, "\n", 1);
        line++;
        p = end ? end + 1 : p + n;
    }
    return 0;
}

/* The template's path as the body of a C string literal for #line: '"'
 * and '\\' escaped, control characters as octal escapes (a folder name may
 * hold any of them). Pushed on the Lua stack. */
static void push_line_name(lua_State *L, const char *path) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (const unsigned char *c = (const unsigned char *)path; *c; c++) {
        if (*c == '"' || *c == '\\') {
            luaL_addchar(&b, '\\');
            luaL_addchar(&b, (char)*c);
        } else if (*c < 32 || *c == 127) {
            char e[8];
            snprintf(e, sizeof e, "\\%03o", *c);
            luaL_addstring(&b, e);
        } else {
            luaL_addchar(&b, (char)*c);
        }
    }
    luaL_pushresult(&b);
}

/* __out(file_upvalue; line, parts...): parts are strings or numbers; the
 * output of one expansion is capped at TMPL_OUT_LIMIT bytes. */
static int l_out(lua_State *L) {
    moe_tmpl_t *t = lua_touserdata(L, lua_upvalueindex(1));
    const char *file = lua_tostring(L, lua_upvalueindex(2));
    int line = (int)luaL_checkinteger(L, 1);
    if (!t->out)
        return luaL_error(L, "template output outside an expansion");
    int n = lua_gettop(L);
    size_t total = 0;
    for (int i = 2; i <= n; i++) {
        size_t len;
        if (!lua_isstring(L, i))
            return luaL_error(L, "template output: argument %d is a %s, not text", i, luaL_typename(L, i));
        lua_tolstring(L, i, &len);
        total += len;
    }
    if (total > TMPL_OUT_LIMIT || t->out->len > TMPL_OUT_LIMIT - total)
        return luaL_error(L, "template output over %d MiB", (int)(TMPL_OUT_LIMIT >> 20));
    if (t->last_file != file || line != t->last_line + 1)
        moe_buf_printf(t->out, "#line %d \"%s\"\n", line, file);
    t->last_file = file;
    t->last_line = line;
    for (int i = 2; i <= n; i++) {
        size_t len;
        const char *s = lua_tolstring(L, i, &len);
        moe_buf_append(t->out, s, len);
    }
    moe_buf_append(t->out, "\n", 1);
    return 0;
}

/* __s(v): the text an interpolated value becomes. Integers print plainly,
 * other numbers with %.17g trimmed; booleans and nil are errors (they are
 * almost always a missing parameter). */
static int l_s(lua_State *L) {
    int ty = lua_type(L, 1);
    if (ty == LUA_TSTRING) {
        lua_settop(L, 1);
        return 1;
    }
    if (ty == LUA_TNUMBER) {
        if (lua_isinteger(L, 1)) {
            lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, 1));
        } else {
            char b[40];
            double v = lua_tonumber(L, 1);
            for (int prec = 1; prec <= 17; prec++) {
                snprintf(b, sizeof b, "%.*g", prec, v);
                if (strtod(b, NULL) == v)
                    break;
            }
            lua_pushstring(L, b);
        }
        return 1;
    }
    return luaL_error(L, "cannot interpolate %s (a missing parameter?)", luaL_typename(L, 1));
}

/* f32(x): a CUDA float literal that reads back to the same float. */
static int l_f32(lua_State *L) {
    double v = luaL_checknumber(L, 1);
    float f = (float)v;
    char b[48];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, (double)f);
        if (strtof(b, NULL) == f)
            break;
    }
    if (!strpbrk(b, ".eEn"))
        strcat(b, ".0");
    strcat(b, "f");
    lua_pushstring(L, b);
    return 1;
}

/* Load template `name` as a function whose environment is a new table
 * (globals fall back to the sandbox's), leaving the function and the env
 * on the stack. Returns 0 or non-zero with t->err set. */
static int load_template(moe_tmpl_t *t, const char *name) {
    lua_State *L = t->L;
    char display[512], err[512];
    char *src = tmpl_source(t, name, display, sizeof display, err, sizeof err);
    if (!src) {
        snprintf(t->err, sizeof t->err, "%s:1: error: %s", display, err); /* the real path under --templates */
        return 1;
    }
    moe_buf_t lua = {0};
    int bad = translate(src, &lua, err, sizeof err);
    free(src);
    if (bad) {
        snprintf(t->err, sizeof t->err, "%s:%d: error: %s", display, bad, err);
        moe_buf_free(&lua);
        return 1;
    }
    char chunk[520];
    snprintf(chunk, sizeof chunk, "@%s", display);
    int rc = luaL_loadbufferx(L, lua.data ? lua.data : "", lua.len, chunk, "t");
    moe_buf_free(&lua);
    if (rc != LUA_OK) {
        snprintf(t->err, sizeof t->err, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return 1;
    }
    /* env = setmetatable({__out = closure(file)}, {__index = _G}) */
    lua_newtable(L);
    lua_pushlightuserdata(L, t);
    push_line_name(L, display);
    lua_pushcclosure(L, l_out, 2);
    lua_setfield(L, -2, "__out");
    lua_newtable(L);
    lua_pushglobaltable(L);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setupvalue(L, -3, 1);
    return 0;
}

/* import(name): run templates/NAME.lua once and cache its result. */
static int l_import(lua_State *L) {
    moe_tmpl_t *t = lua_touserdata(L, lua_upvalueindex(1));
    size_t len;
    const char *name = luaL_checklstring(L, 1, &len);
    /* a template of the folder by name: no path (no '/', so no ".." or
     * absolute path), no NUL, not empty */
    int ok = len > 0 && len < 64;
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)name[i]) || name[i] == '_' || name[i] == '-';
    if (!ok)
        return luaL_error(L, "import: '%s' is not a template name (letters, digits, '_' and '-': a template of the "
                          "templates folder)", name);
    lua_getfield(L, LUA_REGISTRYINDEX, "moegen_imports");
    if (lua_getfield(L, -1, name) != LUA_TNIL)
        return 1;
    lua_pop(L, 1);
    if (load_template(t, name))
        return luaL_error(L, "%s", t->err);
    lua_pop(L, 1); /* env */
    lua_call(L, 0, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, name);
    return 1;
}

moe_tmpl_t *moe_tmpl_open(const char *dir) {
    moe_tmpl_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (dir && !(t->dir = strdup(dir))) {
        free(t);
        return NULL;
    }
    t->L = moe_sandbox_new(&t->sb, TMPL_MEM_LIMIT, TMPL_INSTR_LIMIT, 1);
    if (!t->L) {
        free(t->dir);
        free(t);
        return NULL;
    }
    lua_State *L = t->L;
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "moegen_imports");
    lua_pushlightuserdata(L, t);
    lua_pushcclosure(L, l_import, 1);
    lua_setglobal(L, "import");
    lua_pushcfunction(L, l_s);
    lua_setglobal(L, "__s");
    lua_pushcfunction(L, l_f32);
    lua_setglobal(L, "f32");
    return t;
}

void moe_tmpl_close(moe_tmpl_t *t) {
    if (!t)
        return;
    lua_close(t->L);
    free(t->dir);
    free(t);
}

/* Lua's message msg (n bytes) without the translation's internal names: a
 * syntax error at the start of a text line (its ';' or __out) is an
 * unfinished '@' line above it; __out and __s are the text output and the
 * ${} interpolation. Into out. */
static void tmpl_plain_msg(const char *msg, size_t n, int text_line, char *out, size_t outlen) {
    static const struct {
        const char *from, *to;
        int text_only;
    } subs[] = {
        {"near ';'", "at this text line (the Lua statement of the '@' lines above it is unfinished)", 1},
        {"near '__out'", "at this text line (the Lua statement of the '@' lines above it is unfinished)", 1},
        {"'__out'", "the template's text output", 0},
        {"'__s'", "the ${} interpolation", 0},
    };
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < outlen;) {
        size_t j = 0;
        for (; j < sizeof subs / sizeof *subs; j++) {
            size_t fl = strlen(subs[j].from);
            if ((!subs[j].text_only || text_line) && i + fl <= n && strncmp(msg + i, subs[j].from, fl) == 0) {
                o += (size_t)snprintf(out + o, outlen - o, "%s", subs[j].to);
                if (o >= outlen)
                    o = outlen - 1;
                i += fl;
                break;
            }
        }
        if (j == sizeof subs / sizeof *subs)
            out[o++] = msg[i++];
    }
    out[o] = '\0';
}

/* Rewrite a Lua error "file:line: msg" as "file:line: error: msg" followed
 * by the template line itself. */
static void tmpl_diag(moe_tmpl_t *t, const char *lmsg, moe_diag_t *diag) {
    const char *colon = strchr(lmsg, ':');
    int line = 0;
    if (colon && isdigit((unsigned char)colon[1]))
        line = atoi(colon + 1);
    if (!colon || !line) {
        snprintf(diag->msg, sizeof diag->msg, "%s", lmsg);
        return;
    }
    const char *msg = strchr(colon + 1, ':');
    msg = msg ? msg + 1 : "";
    while (*msg == ' ')
        msg++;
    if (strncmp(msg, "error: ", 7) == 0)
        msg += 7;
    char file[512];
    snprintf(file, sizeof file, "%.*s", (int)(colon - lmsg), lmsg);
    /* the offending line, from the template source */
    char text[256] = "";
    const char *name = strrchr(file, '/');
    name = name ? name + 1 : file;
    char base[128];
    snprintf(base, sizeof base, "%s", name);
    char *dot = strstr(base, ".lua");
    if (dot) {
        *dot = '\0';
        char display[512], err[64];
        char *src = tmpl_source(t, base, display, sizeof display, err, sizeof err);
        if (src) {
            const char *p = src;
            for (int l = 1; l < line && p; l++) {
                p = strchr(p, '\n');
                if (p)
                    p++;
            }
            if (p) {
                const char *e = strchr(p, '\n');
                snprintf(text, sizeof text, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
            }
            free(src);
        }
    }
    /* keep only the first line of msg (drop any traceback) */
    const char *nl = strchr(msg, '\n');
    const char *lead = text;
    while (*lead == ' ' || *lead == '\t')
        lead++;
    char plain[1024];
    tmpl_plain_msg(msg, nl ? (size_t)(nl - msg) : strlen(msg), text[0] && *lead != '@', plain, sizeof plain);
    snprintf(diag->msg, sizeof diag->msg, "%s:%d: error: %s%s%s", file, line, plain, text[0] ? "\n    " : "",
             text);
}

int moe_tmpl_expand(moe_tmpl_t *t, const char *name, const char *fn, moe_buf_t *out, moe_diag_t *diag) {
    lua_State *L = t->L;
    int params = lua_gettop(L);
    t->out = out;
    int rc;
    if (!fn) {
        if (load_template(t, name)) {
            tmpl_diag(t, t->err, diag);
            lua_settop(L, params - 1);
            t->out = NULL;
            return 1;
        }
        /* stack: params, fn, env */
        lua_pushvalue(L, params);
        lua_setfield(L, -2, "p");
        lua_pop(L, 1);
        rc = moe_sandbox_pcall(L, 0, 0, 0);
    } else {
        lua_getglobal(L, "import");
        lua_pushstring(L, name);
        rc = moe_sandbox_pcall(L, 1, 1, 0);
        if (rc == LUA_OK) {
            if (lua_type(L, -1) != LUA_TTABLE || lua_getfield(L, -1, fn) != LUA_TFUNCTION) {
                snprintf(diag->msg, sizeof diag->msg, "templates/%s.lua:1: error: the template has no function '%s'",
                         name, fn);
                lua_settop(L, params - 1);
                t->out = NULL;
                return 1;
            }
            lua_pushvalue(L, params);
            rc = moe_sandbox_pcall(L, 1, 0, 0);
        }
    }
    if (rc != LUA_OK)
        tmpl_diag(t, lua_tostring(L, -1) ? lua_tostring(L, -1) : "template error", diag);
    lua_settop(L, params - 1);
    t->out = NULL;
    return rc != LUA_OK;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The template names in use: the embedded ones, or every *.lua in the
 * override folder (a helper that exists only there counts too). Sorted;
 * caller frees each name and the array. Returns the count, or -1. */
static int tmpl_names(moe_tmpl_t *t, char ***out) {
    char **names = NULL;
    int n = 0, cap = 0, oom = 0;
    DIR *d = NULL;
    if (t->dir && !(d = opendir(t->dir)))
        return -1;
    for (size_t i = 0;; i++) {
        const char *nm;
        char buf[256];
        if (d) {
            struct dirent *de = readdir(d);
            if (!de)
                break;
            size_t l = strlen(de->d_name);
            if (l < 5 || strcmp(de->d_name + l - 4, ".lua") != 0)
                continue;
            snprintf(buf, sizeof buf, "%.*s", (int)(l - 4), de->d_name);
            nm = buf;
        } else {
            if (i >= moe_embedded_templates_count)
                break;
            const char *path = moe_embedded_templates[i].path + strlen("templates/");
            snprintf(buf, sizeof buf, "%.*s", (int)(strlen(path) - 4), path);
            nm = buf;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, sizeof *names * (size_t)cap);
            if (!nn) {
                oom = 1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(nm))) {
            oom = 1;
            break;
        }
        n++;
    }
    if (d)
        closedir(d);
    if (oom) { /* a partial list would hash to a wrong key */
        for (int i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return -1;
    }
    qsort(names, (size_t)n, sizeof *names, by_name);
    *out = names;
    return n;
}

int moe_tmpl_content_hash(moe_tmpl_t *t, char out[33]) {
    char **names;
    int n = tmpl_names(t, &names);
    if (n < 0)
        return 1;
    /* each template's name (with its NUL) then its text, in name order */
    moe_buf_t all = {0};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char display[512], err[256];
        char *src = rc ? NULL : tmpl_source(t, names[i], display, sizeof display, err, sizeof err);
        if (!rc && !src)
            rc = 1;
        if (src) {
            moe_buf_append(&all, names[i], strlen(names[i]) + 1);
            moe_buf_append(&all, src, strlen(src));
            free(src);
        }
        free(names[i]);
    }
    free(names);
    if (!rc && !all.failed)
        moe_hash_hex(all.data ? all.data : "", all.len, out);
    rc |= all.failed;
    moe_buf_free(&all);
    return rc;
}
