/* sandbox.h — a Lua state with capped memory and instructions.
 *
 * Used for both spec files (no libraries at all) and templates (base,
 * string, table, math only; no io, os, package, debug, load, dofile). */
#ifndef MOEGEN_SANDBOX_H
#define MOEGEN_SANDBOX_H

#include <stddef.h>
#include <lua.h>

typedef struct {
    size_t mem_used, mem_limit;
    long instr_count, instr_limit;   /* counted in units of the hook period */
    int tripped;                     /* the instruction limit was reached: nothing may catch it */
} moe_sandbox_t;

/* Create a state whose allocations past mem_limit bytes fail (Lua then
 * raises "not enough memory") and which raises "instruction limit exceeded"
 * after about instr_limit VM instructions. With libs != 0, opens only the
 * libraries templates need (base, string, table, math) and closes what
 * would let a template slip the limits:
 *   - the loaders and print are gone (nothing reads files or writes stdout);
 *   - pcall and xpcall do not catch the instruction limit: once reached,
 *     every protected call re-raises it, so it ends the whole chunk;
 *   - setmetatable refuses a metatable with __gc (finalizers run with the
 *     instruction hook off, at a collection and at lua_close);
 *   - string.find, match, gmatch and gsub, whose backtracking runs in C,
 *     first charge their worst case (pattern length times (subject
 *     length + 1) to the power of the pattern's repetitions + 1) to the
 *     instruction count.
 * The moe_sandbox_t must outlive the state. Returns NULL when the state
 * cannot be made. */
lua_State *moe_sandbox_new(moe_sandbox_t *sb, size_t mem_limit, long instr_limit, int libs);

/* lua_pcall with a traceback handler; on error the message (with traceback
 * when tb != 0) is left on the stack. Returns the lua_pcall status. */
int moe_sandbox_pcall(lua_State *L, int nargs, int nres, int tb);

#endif
