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

static void sandbox_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    moe_sandbox_t *sb = *(moe_sandbox_t **)lua_getextraspace(L);
    sb->instr_count += HOOK_PERIOD;
    if (sb->instr_count > sb->instr_limit) {
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

lua_State *moe_sandbox_new(moe_sandbox_t *sb, size_t mem_limit, long instr_limit, int libs) {
    sb->mem_used = 0;
    sb->mem_limit = mem_limit;
    sb->instr_count = 0;
    sb->instr_limit = instr_limit;
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
                                           "collectgarbage", "rawequal", NULL};
        for (const char *const *d = drop; *d; d++) {
            lua_pushnil(L);
            lua_setglobal(L, *d);
        }
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
