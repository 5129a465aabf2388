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
} moe_sandbox_t;

/* Create a state whose allocations past mem_limit bytes fail (Lua then
 * raises "not enough memory") and which raises "instruction limit exceeded"
 * after about instr_limit VM instructions. With libs != 0, opens only the
 * libraries templates need and removes the loaders. The moe_sandbox_t must
 * outlive the state. Returns NULL when the state cannot be made. */
lua_State *moe_sandbox_new(moe_sandbox_t *sb, size_t mem_limit, long instr_limit, int libs);

/* lua_pcall with a traceback handler; on error the message (with traceback
 * when tb != 0) is left on the stack. Returns the lua_pcall status. */
int moe_sandbox_pcall(lua_State *L, int nargs, int nres, int tb);

#endif
