/* template.h — expanding Lua templates into CUDA C.
 *
 * A template is CUDA C in which a line whose first non-blank character is
 * '@' is Lua, and ${expr} inside any other line is replaced by the value of
 * the Lua expression. Each template line becomes exactly one line of the Lua
 * chunk, so Lua errors carry template line numbers; each output line is
 * preceded by a #line directive whenever it does not directly follow the
 * previous output line in the same template, so NVRTC errors do too.
 *
 * Globals a template sees: the safe parts of the base library (no print,
 * no loaders; pcall, xpcall, setmetatable and the string patterns guarded
 * as sandbox.h says), string, table, math; `p`, the parameter table;
 * import(name), which runs templates/NAME.lua once and returns its value
 * (NAME: letters, digits, '_', '-'; from an override folder, a regular file
 * of it, not a link); f32(x), a Lua number as a CUDA float literal. */
#ifndef MOEGEN_TEMPLATE_H
#define MOEGEN_TEMPLATE_H

#include "spec.h"
#include "util.h"

#include <lua.h>

typedef struct moe_tmpl moe_tmpl_t;

/* One embedded template (generated at build time into templates_embed.c). */
typedef struct {
    const char *path;   /* "templates/route.lua" */
    const char *text;
    size_t len;
} moe_embedded_t;
extern const moe_embedded_t moe_embedded_templates[];
extern const size_t moe_embedded_templates_count;

/* Open an expander. dir == NULL uses the embedded templates; otherwise
 * templates are read from dir (the --templates override). Returns NULL on
 * allocation failure. */
moe_tmpl_t *moe_tmpl_open(const char *dir);
void moe_tmpl_close(moe_tmpl_t *t);

/* The Lua state, for callers that push parameter tables. */
lua_State *moe_tmpl_lua(moe_tmpl_t *t);

/* Expand template `name` ("route" = templates/route.lua). With fn == NULL
 * the template's top-level chunk is run with p = the table on the top of
 * the Lua stack (popped); with fn != NULL, the template is imported and
 * its module field fn is called with that table. Output is appended to out.
 * Returns 0, or non-zero with diag set to "FILE:LINE: error: MESSAGE" and
 * the offending template line. */
int moe_tmpl_expand(moe_tmpl_t *t, const char *name, const char *fn, moe_buf_t *out, moe_diag_t *diag);

/* XXH3-128 (hex) over the content of every template in use, in name order. */
int moe_tmpl_content_hash(moe_tmpl_t *t, char out[33]);

#endif
