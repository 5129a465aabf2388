/* spec_impl.h — what the spec loader (spec.c) and the schema pass
 * (spec_check.c) share; internal to those files. */
#ifndef MOEGEN_SPEC_IMPL_H
#define MOEGEN_SPEC_IMPL_H

#include "spec.h"

#include <lua.h>

/* One load: where messages point, the Lua state holding the spec's values,
 * the overrides, and whether an error has been recorded (the first wins). */
typedef struct {
    const char *path;          /* file name for messages */
    const char *text;          /* the spec text, for locating nested keys */
    lua_State *L;
    moe_diag_t *diag;
    const moe_override_t *ovr;
    int novr;
    int failed;
} moe_spec_ctx_t;

/* A key by its parent table and its own name; errors on it point at the
 * override that set it, else at its line. */
typedef struct {
    const char *parent;  /* NULL for top-level */
    const char *key;
} moe_keyref_t;

/* Record "FILE:LINE: error: MESSAGE" (or "<command line>:N: error: --set
 * ...: MESSAGE" when an override set the key) for key k; the first error
 * wins. A key of NULL points at line 1. */
void moe_spec_key_error(moe_spec_ctx_t *c, moe_keyref_t k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Fill s from the spec's table at the stack top of c->L: defaults, then
 * every row of the schema, then the relations; on an error c->failed is set
 * and c->diag holds the message. */
void moe_spec_read(moe_spec_ctx_t *c, moe_spec_t *s);

#endif
