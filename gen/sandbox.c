#include "sandbox.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdlib.h>

#define HOOK_PERIOD 1000

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    moe_sandbox_t *sb = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        sb->mem_used -= old;
        free(ptr);
        return NULL;
    }
    if (nsize > old && sb->mem_used + (nsize - old) > sb->mem_limit)
        return NULL;
    void *p = realloc(ptr, nsize);
    if (p)
        sb->mem_used = sb->mem_used - old + nsize;
    return p;
}

static moe_sandbox_t *sandbox_of(lua_State *L) { return *(moe_sandbox_t **)lua_getextraspace(L); }

static void sandbox_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    moe_sandbox_t *sb = sandbox_of(L);
    sb->instr_count += HOOK_PERIOD;
    if (sb->instr_count > sb->instr_limit) {
        sb->tripped = 1;
        lua_Debug where;
        /* lua_error, not luaL_error: the position is added here, once */
        if (lua_getstack(L, 0, &where) && lua_getinfo(L, "Sl", &where) && where.currentline > 0)
            lua_pushfstring(L, "%s:%d: instruction limit exceeded (%d instructions)", where.short_src,
                            where.currentline, (int)sb->instr_limit);
        else
            lua_pushfstring(L, "instruction limit exceeded (%d instructions)", (int)sb->instr_limit);
        lua_error(L);
    }
}

/* The limit's error, raised again where a protected call would catch it. */
static int sandbox_limit(lua_State *L) {
    return luaL_error(L, "instruction limit exceeded (%d instructions)", (int)sandbox_of(L)->instr_limit);
}

/* pcall and xpcall that let the instruction limit through: after the
 * protected call, a tripped sandbox re-raises (whatever the handler made
 * of the error); other errors are caught as usual. */
static int sandbox_finish(lua_State *L, int status, int base) {
    if (sandbox_of(L)->tripped)
        return sandbox_limit(L);
    if (status != LUA_OK) {
        lua_pushboolean(L, 0);
        lua_insert(L, -2);
        return 2;
    }
    lua_pushboolean(L, 1);
    lua_insert(L, base);
    return lua_gettop(L) - base + 1;
}

static int sandbox_pcall(lua_State *L) {
    luaL_checkany(L, 1);
    if (sandbox_of(L)->tripped)
        return sandbox_limit(L);
    int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    return sandbox_finish(L, status, 1);
}

static int sandbox_xpcall(lua_State *L) {
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    if (sandbox_of(L)->tripped)
        return sandbox_limit(L);
    lua_pushvalue(L, 1); /* handler at 1, function at 2, then the arguments */
    lua_copy(L, 2, 1);
    lua_replace(L, 2);
    int status = lua_pcall(L, n - 2, LUA_MULTRET, 1);
    return sandbox_finish(L, status, 2);
}

/* setmetatable that refuses __gc (a finalizer runs without the hook). */
static int sandbox_setmetatable(lua_State *L) {
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "__gc metamethods are not allowed in templates");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* The repetitions of a Lua pattern that make its matcher backtrack or
 * scan: the quantifiers * + - ? after a single-character class, %b and
 * the back references %1..%9 (each a factor of the subject length in the
 * worst case). Sets [...] are skipped whole. */
static int pattern_repeats(const char *p, size_t n) {
    int q = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '%' && i + 1 < n) {
            i++;
            q += p[i] == 'b' || (p[i] >= '1' && p[i] <= '9');
        } else if (p[i] == '[') {
            i += i + 1 < n && p[i + 1] == '^';
            i += i + 1 < n && p[i + 1] == ']'; /* a leading ] is a member */
            while (++i < n && p[i] != ']')
                i += p[i] == '%';
        } else if (p[i] == '*' || p[i] == '+' || p[i] == '-' || p[i] == '?') {
            q += i > 0;
        }
    }
    return q;
}

/* string.find, match, gmatch and gsub (upvalue 1; upvalue 2 is 1 for find,
 * whose 4th argument asks for a plain search): charge the worst case of the
 * match to the instruction count, then call the library's function. */
static int sandbox_pattern(lua_State *L) {
    size_t n, plen;
    luaL_checklstring(L, 1, &n);
    const char *p = luaL_checklstring(L, 2, &plen);
    moe_sandbox_t *sb = sandbox_of(L);
    double cost = (double)n + (double)plen + 1;
    if (!(lua_toboolean(L, lua_upvalueindex(2)) && lua_toboolean(L, 4))) {
        int q = pattern_repeats(p, plen);
        cost = (double)(plen + 1);
        for (int i = 0; i <= q && cost <= (double)sb->instr_limit; i++)
            cost *= (double)n + 1;
    }
    if (sb->tripped || cost > (double)(sb->instr_limit - sb->instr_count)) {
        sb->tripped = 1;
        sb->instr_count = sb->instr_limit + 1;
        return luaL_error(L, "instruction limit exceeded (%d instructions): a pattern with that worst case over %d "
                          "bytes", (int)sb->instr_limit, (int)n);
    }
    sb->instr_count += (long)cost;
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* Replace the libraries' functions that could slip the limits (see
 * moe_sandbox_new). */
static void sandbox_guard(lua_State *L) {
    lua_pushcfunction(L, sandbox_pcall);
    lua_setglobal(L, "pcall");
    lua_pushcfunction(L, sandbox_xpcall);
    lua_setglobal(L, "xpcall");
    lua_getglobal(L, "setmetatable");
    lua_pushcclosure(L, sandbox_setmetatable, 1);
    lua_setglobal(L, "setmetatable");
    static const char *const pat[] = {"find", "match", "gmatch", "gsub", NULL};
    lua_getglobal(L, LUA_STRLIBNAME); /* also the strings' metatable's __index */
    for (const char *const *f = pat; *f; f++) {
        lua_getfield(L, -1, *f);
        lua_pushboolean(L, f == pat); /* find */
        lua_pushcclosure(L, sandbox_pattern, 2);
        lua_setfield(L, -2, *f);
    }
    lua_pop(L, 1);
}

lua_State *moe_sandbox_new(moe_sandbox_t *sb, size_t mem_limit, long instr_limit, int libs) {
    sb->mem_used = 0;
    sb->mem_limit = mem_limit;
    sb->instr_count = 0;
    sb->instr_limit = instr_limit;
    sb->tripped = 0;
    lua_State *L = lua_newstate(sandbox_alloc, sb);
    if (!L)
        return NULL;
    *(moe_sandbox_t **)lua_getextraspace(L) = sb;
    lua_sethook(L, sandbox_hook, LUA_MASKCOUNT, HOOK_PERIOD);
    if (libs) {
        static const luaL_Reg keep[] = {
            {LUA_GNAME, luaopen_base}, {LUA_STRLIBNAME, luaopen_string},
            {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
            {NULL, NULL}};
        for (const luaL_Reg *r = keep; r->name; r++) {
            luaL_requiref(L, r->name, r->func, 1);
            lua_pop(L, 1);
        }
        static const char *const drop[] = {"dofile", "loadfile", "load", "require",
                                           "collectgarbage", "rawequal", "print", NULL};
        for (const char *const *d = drop; *d; d++) {
            lua_pushnil(L);
            lua_setglobal(L, *d);
        }
        sandbox_guard(L);
    }
    return L;
}

static int sandbox_traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg)
        msg = luaL_tolstring(L, 1, NULL);
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static int sandbox_plain(lua_State *L) {
    if (!lua_tostring(L, 1))
        luaL_tolstring(L, 1, NULL);
    return 1;
}

int moe_sandbox_pcall(lua_State *L, int nargs, int nres, int tb) {
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, tb ? sandbox_traceback : sandbox_plain);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nres, base);
    lua_remove(L, base);
    return rc;
}
