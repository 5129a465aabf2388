/* spec_check.c — the schema pass: read every key of a loaded spec against
 * its row in spec_schema.c (type, range, choices), then each row's own
 * relations, then the relations between keys. */
#include "spec_impl.h"
#include "spec_schema.h"

#include <ctype.h>
#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- reading one key ---------------------------------------------------- */

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
static void check_keys(moe_spec_ctx_t *c, int idx, const char *parent, const char *const *known) {
    lua_State *L = c->L;
    lua_pushnil(L);
    while (!c->failed && lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            moe_spec_key_error(c, (moe_keyref_t){NULL, parent}, "%s: keys must be names, not %s", parent ? parent : "spec",
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
                moe_spec_key_error(c, (moe_keyref_t){parent, key}, "unknown key '%s' (did you mean '%s%s%s'?)", full,
                          parent ? parent : "", parent ? "." : "", near);
            else
                moe_spec_key_error(c, (moe_keyref_t){parent, key}, "unknown key '%s'", full);
        }
    }
    if (c->failed)
        lua_settop(L, idx);
}

/* A key's full name split into its parent (copied into buf; NULL for a
 * top-level key) and its own name. */
static moe_keyref_t key_ref(const char *name, char *buf, size_t n) {
    const char *dot = strchr(name, '.');
    if (!dot)
        return (moe_keyref_t){NULL, name};
    snprintf(buf, n, "%.*s", (int)(dot - name), name);
    return (moe_keyref_t){buf, dot + 1};
}

/* Report an error on the key of full name `name`. */
#define NAMED_ERROR(c, name, ...)                                                                                  \
    do {                                                                                                           \
        char parent_[64];                                                                                          \
        moe_spec_key_error(c, key_ref(name, parent_, sizeof parent_), __VA_ARGS__);                                         \
    } while (0)

/* "a", "b" and "c" (and = NULL: "a", "b", "c"), quoted. */
static void join_choices(char *buf, size_t n, const char *const *choices, const char *last_sep) {
    buf[0] = '\0';
    for (int j = 0; choices[j]; j++) {
        const char *sep = j == 0 ? "" : (last_sep && !choices[j + 1]) ? last_sep : ", ";
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s\"%s\"", sep, choices[j]);
    }
}

/* The index of v in choices, or -1. */
static int choice_index(const char *const *choices, const char *v) {
    for (int i = 0; choices[i]; i++)
        if (strcmp(choices[i], v) == 0)
            return i;
    return -1;
}

static int value_of(const moe_key_t *k, int i) { return k->values ? k->values[i] : i; }

/* Read a LIST value at the stack top into out[] (choice indices; a refused
 * value as the index nchoices); returns the count, 0 after an error. */
/* v has no fractional part (formatted with ".0" so it reads as a float);
 * false for NaN and the infinities, and tested without converting to an
 * integer type (undefined for NaN, inf and values beyond long long). */
static int whole_number(double v) { return isfinite(v) && floor(v) == v; }

/* The string on top of L, or NULL (the error reported) when it holds a NUL
 * byte: C would read the part before it as the whole ("fp16\0junk" as fp16). */
static const char *plain_string(moe_spec_ctx_t *c, moe_keyref_t kr, const char *fn, lua_State *L) {
    size_t n;
    const char *v = lua_tolstring(L, -1, &n);
    if (strlen(v) != n) {
        moe_spec_key_error(c, kr, "%s holds a NUL byte (after \"%s\"); strings must be plain text", fn, v);
        return NULL;
    }
    return v;
}

/* The emitted symbols are NAME_forward, NAME_pack_w1, ...: a name of "moe"
 * or "moe_..." could collide with libmoegen's own moe_ API. */
static int reserved_name(const char *v) { return strncmp(v, "moe", 3) == 0 && (v[3] == 0 || v[3] == '_'); }

static int read_list(moe_spec_ctx_t *c, moe_keyref_t kr, const moe_key_t *k, int *out) {
    lua_State *L = c->L;
    const char *fn = k->name;
    int max = moe_key_nchoices(k), n = 0;
    if (lua_type(L, -1) == LUA_TSTRING) {
        lua_newtable(L);
        lua_insert(L, -2);
        lua_rawseti(L, -2, 1);
    } else if (lua_type(L, -1) != LUA_TTABLE) {
        moe_spec_key_error(c, kr, "%s must be a list of strings, got %s", fn, type_word(L, -1));
        return 0;
    }
    if (lua_getmetatable(L, -1)) { /* _ENV: its metamethods would run, and raise, outside Lua */
        lua_pop(L, 1);
        moe_spec_key_error(c, kr, "%s must be a list of strings, not a table with a metatable (such as _ENV)", fn);
        return 0;
    }
    int len = (int)lua_rawlen(L, -1);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > len) {
            moe_spec_key_error(c, kr, "%s must be a list of strings (no named keys)", fn);
            lua_pop(L, 1);
            return 0;
        }
    }
    if (len == 0 || len > max) {
        moe_spec_key_error(c, kr, "%s must list 1 to %d items, got %d", fn, max, len);
        return 0;
    }
    for (int i = 1; i <= len && !c->failed; i++) {
        lua_rawgeti(L, -1, i);
        if (lua_type(L, -1) != LUA_TSTRING) {
            moe_spec_key_error(c, kr, "%s[%d] must be a string, got %s", fn, i, type_word(L, -1));
        } else {
            const char *v = plain_string(c, kr, fn, L);
            if (!v) {
                lua_pop(L, 1);
                break;
            }
            int j = choice_index(k->choices, v);
            if (j < 0 && k->refused && strcmp(v, k->refused) == 0)
                j = max;
            if (j < 0)
                moe_spec_key_error(c, kr, "%s[%d] = \"%s\" is not a known value", fn, i, v);
            for (int m = 0; m < n && !c->failed; m++)
                if (out[m] == j)
                    moe_spec_key_error(c, kr, "%s lists \"%s\" twice", fn, v);
            out[n++] = j;
        }
        lua_pop(L, 1);
    }
    if (c->failed)
        return 0;
    char list[256];
    for (int i = 0; i < n; i++)
        if (out[i] == max) {
            join_choices(list, sizeof list, k->choices, " and ");
            moe_spec_key_error(c, kr, "%s may name %s only, not \"%s\"", fn, list, k->refused);
            return 0;
        }
    if (!k->count_offset && n != max) {
        join_choices(list, sizeof list, k->choices, NULL);
        moe_spec_key_error(c, kr, "%s must list each of %s once", fn, list);
        return 0;
    }
    return n;
}

/* Read row k from the table at idx into s, checking its type, range and
 * choices; an absent key keeps the default already in s (an error when the
 * key is required). */
static void read_key(moe_spec_ctx_t *c, int idx, const moe_key_t *k, moe_spec_t *s) {
    if (c->failed)
        return;
    lua_State *L = c->L;
    char parent[64];
    moe_keyref_t kr = key_ref(k->name, parent, sizeof parent);
    const char *fn = k->name;
    char *p = (char *)s + k->offset;
    idx = lua_absindex(L, idx);
    lua_pushstring(L, kr.key);
    int t = lua_rawget(L, idx); /* raw: no metamethod runs (get_table refuses tables that have them) */
    if (t == LUA_TNIL) {
        if (k->required)
            moe_spec_key_error(c, (moe_keyref_t){NULL, NULL}, "missing required key '%s'", fn);
        lua_pop(L, 1);
        return;
    }
    switch (k->type) {
    case MOE_KEY_IDENT:
        if (t != LUA_TSTRING) {
            moe_spec_key_error(c, kr, "%s must be a string, got %s", fn, type_word(L, -1));
        } else {
            const char *v = plain_string(c, kr, fn, L);
            if (!v)
                break;
            size_t n = strlen(v);
            int ok = n > 0 && n <= (size_t)k->hi && (isalpha((unsigned char)v[0]) || v[0] == '_');
            for (size_t i = 0; ok && i < n; i++)
                ok = isalnum((unsigned char)v[i]) || v[i] == '_';
            if (!ok)
                moe_spec_key_error(c, kr,
                          "%s = \"%s\" must be a C identifier of at most %d characters "
                          "(letters, digits, '_'; not starting with a digit)", fn, v, (int)k->hi);
            else if (reserved_name(v))
                moe_spec_key_error(c, kr, "%s = \"%s\" is reserved: the emitted symbols (%s_forward, ...) would "
                                   "collide with libmoegen's moe_ API; choose another name", fn, v, v);
            else
                memcpy(p, v, n + 1);
        }
        break;
    case MOE_KEY_INT:
        if (!lua_isinteger(L, -1)) {
            double v = lua_tonumber(L, -1);
            if (t == LUA_TNUMBER)
                moe_spec_key_error(c, kr, "%s must be an integer, got %.17g%s", fn, v, whole_number(v) ? ".0" : "");
            else
                moe_spec_key_error(c, kr, "%s must be an integer, got %s", fn, type_word(L, -1));
        } else {
            long long v = lua_tointeger(L, -1), lo = (long long)k->lo, hi = (long long)k->hi;
            if (v < lo || v > hi)
                moe_spec_key_error(c, kr, "%s = %lld is out of range [%lld, %lld]", fn, v, lo, hi);
            else
                *(int *)p = (int)v;
        }
        break;
    case MOE_KEY_NUM:
        if (t != LUA_TNUMBER) {
            moe_spec_key_error(c, kr, "%s must be a number, got %s", fn, type_word(L, -1));
        } else {
            double v = lua_tonumber(L, -1);
            if (!(v >= k->lo && v <= k->hi))
                moe_spec_key_error(c, kr, "%s = %g is out of range [%g, %g]", fn, v, k->lo, k->hi);
            else
                *(double *)p = v;
        }
        break;
    case MOE_KEY_BOOL:
        if (t != LUA_TBOOLEAN)
            moe_spec_key_error(c, kr, "%s must be true or false, got %s", fn, type_word(L, -1));
        else
            *(bool *)p = lua_toboolean(L, -1);
        break;
    case MOE_KEY_ENUM:
        if (t != LUA_TSTRING) {
            moe_spec_key_error(c, kr, "%s must be a string, got %s", fn, type_word(L, -1));
        } else {
            const char *v = plain_string(c, kr, fn, L);
            int i = v ? choice_index(k->choices, v) : 0;
            if (!v) {
            } else if (i >= 0) {
                *(int *)p = value_of(k, i);
            } else {
                char list[256];
                join_choices(list, sizeof list, k->choices, NULL);
                moe_spec_key_error(c, kr, "%s = \"%s\" is not one of %s", fn, v, list);
            }
        }
        break;
    case MOE_KEY_LIST: {
        int items[MOE_KEY_LIST_MAX + 1];
        int n = read_list(c, kr, k, items);
        if (n > 0) {
            for (int i = 0; i < n; i++)
                ((int *)p)[i] = value_of(k, items[i]);
            if (k->count_offset)
                *(int *)((char *)s + k->count_offset) = n;
        }
        break;
    }
    }
    lua_pop(L, 1);
}

/* Push the sub-table at key (or an empty table when absent). */
static int get_table(moe_spec_ctx_t *c, int idx, moe_keyref_t k) {
    lua_State *L = c->L;
    idx = lua_absindex(L, idx);
    lua_pushstring(L, k.key);
    int t = lua_rawget(L, idx);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
    } else if (t != LUA_TTABLE) {
        moe_spec_key_error(c, k, "%s must be a table, got %s", k.key, type_word(L, -1));
    } else if (lua_getmetatable(L, -1)) { /* _ENV: reading it would run the spec's metamethods */
        lua_pop(L, 1);
        moe_spec_key_error(c, k, "%s must be a table of keys, not a table with a metatable (such as _ENV)", k.key);
    }
    return lua_gettop(L);
}

/* ---- validation --------------------------------------------------------- */

/* The names a table may hold, in table order, into out[] (NULL-terminated):
 * the top-level names (a nested key's parent once, written into names[])
 * when parent is NULL, else the keys under parent. */
static void known_keys(const char *parent, char names[][32], const char **out) {
    int n = 0;
    size_t pl = parent ? strlen(parent) : 0;
    for (int i = 0; i < moe_spec_nkeys && i < MOE_SPEC_MAX_KEYS; i++) {
        const char *name = moe_spec_keys[i].name;
        size_t tl = strcspn(name, ".");
        if (parent) {
            if (tl == pl && strncmp(name, parent, pl) == 0 && name[tl])
                out[n++] = name + tl + 1;
        } else if (!name[tl]) {
            out[n++] = name;
        } else if (i == 0 || strncmp(moe_spec_keys[i - 1].name, name, tl + 1) != 0) {
            snprintf(names[n], 32, "%.*s", (int)tl, name);
            out[n] = names[n];
            n++;
        }
    }
    out[n] = NULL;
}

/* Relations between keys that belong to no single key; each names the key
 * its error is reported on. Run once every key has been read. */
static void check_relations(moe_spec_ctx_t *c, const moe_spec_t *s) {
    if (s->activation.clamp == MOE_CLAMP_AFTER && !(s->activation.limit > 0)) {
        NAMED_ERROR(c, "activation.clamp", "activation.clamp = \"after\" clamps the unit's output at "
                    "activation.limit: set activation.limit");
        return;
    }
    if (s->activation.kind == MOE_ACT_RELU2 && (s->activation.limit > 0 || s->activation.up_offset != 0)) {
        const char *key = s->activation.limit > 0 ? "activation.limit" : "activation.up_offset";
        NAMED_ERROR(c, key, "%s with activation.kind = \"relu2\" is not supported: relu2's unit reads the gate "
                    "alone (NemotronH's experts have no clamp)", key);
        return;
    }
    const moe_router_t *r = &s->router;
    const moe_dispatch_t *d = &s->dispatch;
    long long rows = (long long)s->tokens * s->top_k;
    long long welems = (long long)s->experts * 2 * s->ffn * s->hidden;
    long long world = (long long)s->mesh.size[0] * s->mesh.size[1] * s->mesh.size[2];
    int shard = 1;
    for (int i = 0; i < s->mesh.nsharding; i++)
        shard *= s->mesh.size[s->mesh.sharding[i]];
    if (d->mode == MOE_DISPATCH_CAPACITY && d->capacity == 0)
        NAMED_ERROR(c, "dispatch.mode",
                    "dispatch.mode = \"capacity\" needs dispatch.capacity, the most rows one rank sends to one "
                    "EP peer");
    else if (d->mode == MOE_DISPATCH_EXACT && d->capacity != 0)
        NAMED_ERROR(c, "dispatch.capacity", "dispatch.capacity applies to mode = \"capacity\" only (mode is \"exact\")");
    else if (r->groups > 1 && s->top_k > r->topk_groups * (s->experts / r->groups))
        NAMED_ERROR(c, "router.topk_groups", "top_k (%d) exceeds the experts in the kept groups (%d groups of %d)",
                    s->top_k, r->topk_groups, s->experts / r->groups);
    else if (r->groups > 1 && r->group_topk > s->experts / r->groups)
        NAMED_ERROR(c, "router.group_topk",
                    "router.group_topk (%d) exceeds the experts in a group (%d = experts / router.groups): a group "
                    "scores the sum of its top group_topk selection scores", r->group_topk, s->experts / r->groups);
    else if (rows > MOE_LIMIT_ROWS)
        NAMED_ERROR(c, "tokens", "tokens * top_k (%lld) exceeds the limit of %lld rows", rows, MOE_LIMIT_ROWS);
    else if (welems > MOE_LIMIT_WEIGHT_ELEMS)
        NAMED_ERROR(c, "experts", "experts * 2 * ffn * hidden (%lld) exceeds the limit of %lld weight elements",
                    welems, MOE_LIMIT_WEIGHT_ELEMS);
    else if (world > MOE_LIMIT_WORLD)
        NAMED_ERROR(c, "mesh", "the mesh has %lld devices, more than the limit of %d", world, MOE_LIMIT_WORLD);
    else if (s->experts % shard)
        NAMED_ERROR(c, "experts", "experts (%d) must be divisible by the product of the expert_sharding axes (%d)",
                    s->experts, shard);
    else if (s->experts % s->mesh.size[MOE_AXIS_EP])
        NAMED_ERROR(c, "experts", "experts (%d) must be divisible by mesh.ep (%d)", s->experts,
                    s->mesh.size[MOE_AXIS_EP]);
}

/* router.score = "sparsemixer" (Phi-3.5-MoE; docs/DESIGN.md, "Routing,
 * exactly"): its weights are its own rule over the logits, for the two
 * slots transformers defines, at inference (the model trains with Gumbel
 * sampling and its own gradient estimate, which the backward does not
 * reproduce). */
static void check_sparsemixer(moe_spec_ctx_t *c, const moe_spec_t *s) {
    const moe_router_t *r = &s->router;
    if (r->score != MOE_SCORE_SPARSEMIXER)
        return;
    static const char why[] = "with router.score = \"sparsemixer\" (Phi-3.5-MoE's rule)";
    if (s->top_k != 2)
        NAMED_ERROR(c, "top_k", "top_k = %d %s: the rule is defined for top-2", s->top_k, why);
    else if (r->renormalize)
        NAMED_ERROR(c, "router.renormalize", "router.renormalize = true %s: its weights are not renormalized; set "
                    "router.renormalize = false", why);
    else if (r->bias || r->logit_bias || r->logit_softcap > 0)
        NAMED_ERROR(c, r->bias ? "router.bias" : r->logit_bias ? "router.logit_bias" : "router.logit_softcap",
                    "%s %s: the rule reads the plain logits",
                    r->bias ? "router.bias" : r->logit_bias ? "router.logit_bias" : "router.logit_softcap", why);
    else if (r->groups > 1)
        NAMED_ERROR(c, "router.groups", "router.groups = %d %s: the selection is the top-2 of all logits", r->groups,
                    why);
    else if (r->apply == MOE_APPLY_INPUT)
        NAMED_ERROR(c, "router.apply", "router.apply = \"input\" %s is not supported", why);
    else if (s->training)
        NAMED_ERROR(c, "training", "training = true %s is not supported: the model trains with sampled experts "
                    "and its own gradient estimate", why);
}

/* Given routing (router.select = "given", docs/DESIGN.md "Given
 * routing"): the caller's ids pick the experts, so nothing that only moves
 * the selection applies; what carries them is the one-device inference
 * forward. router.score = "given" (the caller's weights too) reads no
 * logits. Run after check_sparsemixer, on a spec whose keys all read. */
static void check_given(moe_spec_ctx_t *c, const moe_spec_t *s) {
    const moe_router_t *r = &s->router;
    if (r->select != MOE_SELECT_GIVEN) {
        if (r->score == MOE_SCORE_GIVEN)
            NAMED_ERROR(c, "router.score", "router.score = \"given\" (the caller's weights) needs router.select = "
                        "\"given\" (the caller's ids as well)");
        return;
    }
    static const char why[] = "with router.select = \"given\"";
    if (r->bias)
        NAMED_ERROR(c, "router.bias", "router.bias %s: the selection bias moves only the selection, which the "
                    "caller makes; set router.bias = false", why);
    else if (r->groups > 1)
        NAMED_ERROR(c, "router.groups", "router.groups = %d %s: groups limit the router's selection, which the "
                    "caller makes; leave router.groups out", r->groups, why);
    else if (r->score == MOE_SCORE_SPARSEMIXER)
        NAMED_ERROR(c, "router.score", "router.score = \"sparsemixer\" %s is not supported: its weights are "
                    "defined for its own top-2", why);
    else if (r->score == MOE_SCORE_GIVEN && (r->logit_bias || r->logit_softcap > 0))
        NAMED_ERROR(c, r->logit_bias ? "router.logit_bias" : "router.logit_softcap", "%s with router.score = "
                    "\"given\": the weights are the caller's, no logits are computed",
                    r->logit_bias ? "router.logit_bias" : "router.logit_softcap");
    else if (r->score == MOE_SCORE_GIVEN && s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID)
        NAMED_ERROR(c, "shared.gate", "shared.gate = \"sigmoid\" with router.score = \"given\" is not supported: "
                    "the gate is a router logit, and no logits are computed");
    else if (r->apply == MOE_APPLY_INPUT)
        NAMED_ERROR(c, "router.apply", "router.apply = \"input\" %s is not supported: a dropped entry (an id "
                    "out of range) must add nothing, and with \"input\" its expert would still run on zeros", why);
    else if (s->zero_experts)
        NAMED_ERROR(c, "zero_experts", "zero_experts %s is not supported: the ids name routed experts only", why);
    else if (s->training && r->score == MOE_SCORE_GIVEN)
        NAMED_ERROR(c, "training", "training = true with router.score = \"given\" is not supported: the caller's "
                    "weights would need their gradient back (moe_backward returns the router's)");
}

/* The router's own input and per-expert scale (router.input = "separate",
 * router.expert_scale; Gemma 4): run after check_given. */
static void check_router_extras(moe_spec_ctx_t *c, const moe_spec_t *s) {
    const moe_router_t *r = &s->router;
    const int own = r->input == MOE_ROUTER_INPUT_SEPARATE;
    if (own && r->score == MOE_SCORE_GIVEN)
        NAMED_ERROR(c, "router.input", "router.input = \"separate\" with router.score = \"given\": no logits are "
                    "computed, so nothing reads the router's input; leave router.input out");
    else if (r->hidden && !own)
        NAMED_ERROR(c, "router.hidden", "router.hidden (%d) is the width of router_x: set router.input = "
                    "\"separate\" (the router's own input), or leave router.hidden out", r->hidden);
    else if (r->hidden && r->hidden != s->hidden && s->training)
        NAMED_ERROR(c, "router.hidden", "training = true with router.hidden (%d) other than hidden (%d) is not "
                    "supported yet: the backward's router products (d router_x, d router_w) take hidden's width",
                    r->hidden, s->hidden);
    else if (own && s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID)
        NAMED_ERROR(c, "shared.gate", "shared.gate = \"sigmoid\" with router.input = \"separate\" is not "
                    "supported: the gate is a router logit and would read router_x, not x");
    else if (r->expert_scale && r->score == MOE_SCORE_GIVEN)
        NAMED_ERROR(c, "router.expert_scale", "router.expert_scale with router.score = \"given\": the weights "
                    "are the caller's; scale them before the call");
    else if (r->weight_dtype == MOE_ROUTER_WEIGHT_FP32 && r->score == MOE_SCORE_GIVEN)
        NAMED_ERROR(c, "router.weight_dtype", "router.weight_dtype = \"fp32\" with router.score = \"given\": there "
                    "is no router weight; leave router.weight_dtype out");
    else if (r->weight_dtype == MOE_ROUTER_WEIGHT_FP32 && s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID)
        NAMED_ERROR(c, "shared.gate", "shared.gate = \"sigmoid\" with router.weight_dtype = \"fp32\" is not "
                    "supported: the gate's logit column reads w_gate in the dtype beside the fp32 router rows");
    else if (r->weight_dtype == MOE_ROUTER_WEIGHT_FP32 && s->training)
        NAMED_ERROR(c, "router.weight_dtype", "training = true with router.weight_dtype = \"fp32\" is not supported "
                    "yet: the backward reads the router weight in the dtype");
    else if (r->expert_scale && s->zero_experts)
        NAMED_ERROR(c, "router.expert_scale", "router.expert_scale with zero_experts is not supported");
    else if (s->training && r->expert_scale && r->select == MOE_SELECT_GIVEN)
        NAMED_ERROR(c, "router.expert_scale", "training = true with router.expert_scale and router.select = "
                    "\"given\" is not supported: the backward tells a dropped id by its saved weight 0, which an "
                    "entry whose scale is 0 also has");
}

/* The shared expert's relations (spec.h, moe_spec_shared_slots): run after
 * check_relations, on a spec whose keys all read. */
static void check_shared(moe_spec_ctx_t *c, const moe_spec_t *s) {
    const moe_shared_t *sh = &s->shared;
    /* the key that gives the shared expert a clamp of its own, if one does */
    const char *own = sh->limit > 0 ? "shared.limit" : sh->unclamped ? "shared.unclamped" : NULL;
    if (!sh->ffn) {
        if (sh->gate != MOE_SHARED_GATE_NONE)
            NAMED_ERROR(c, "shared.gate", "shared.gate applies to a shared expert: set shared.ffn, its intermediate "
                        "size");
        else if (own)
            NAMED_ERROR(c, own, "%s applies to a shared expert: set shared.ffn, its intermediate size", own);
        return;
    }
    if (sh->limit > 0 && sh->unclamped) {
        NAMED_ERROR(c, "shared.unclamped", "shared.unclamped = true with shared.limit: the shared expert has a limit "
                    "or none; keep one of them");
        return;
    }
    if (own && !(s->activation.limit > 0)) {
        NAMED_ERROR(c, own, "%s%s needs activation.limit: it sets the shared expert's clamp apart from the routed "
                    "experts' limit (set activation.limit)", own, sh->unclamped ? " = true" : "");
        return;
    }
    long long m = sh->ffn / s->ffn, rows = (long long)s->tokens * (s->top_k + m);
    long long welems = ((long long)s->experts + m) * 2 * s->ffn * s->hidden;
    if (sh->ffn % s->ffn)
        NAMED_ERROR(c, "shared.ffn", "shared.ffn (%d) must be a multiple of ffn (%d): the shared expert runs as "
                    "shared.ffn/ffn expert slots of size ffn", sh->ffn, s->ffn);
    else if (s->ffn_bias)
        NAMED_ERROR(c, "shared.ffn", "shared.ffn with ffn_bias = true is not supported: the shared expert has no "
                    "bias slots");
    else if (sh->gate == MOE_SHARED_GATE_SIGMOID && s->router.apply == MOE_APPLY_INPUT)
        NAMED_ERROR(c, "shared.gate", "shared.gate = \"sigmoid\" with router.apply = \"input\" is not supported: "
                    "the gate scales the shared expert's output, and with \"input\" the weights scale the inputs "
                    "(Llama 4's shared expert is ungated)");
    else if (s->top_k + m > MOE_LIMIT_TOP_K)
        NAMED_ERROR(c, "shared.ffn", "top_k (%d) + shared.ffn/ffn (%lld) exceeds %d entries per token: every token "
                    "visits each of the shared expert's slots", s->top_k, m, MOE_LIMIT_TOP_K);
    else if (s->mesh.size[MOE_AXIS_EP] > 1 || s->mesh.size[MOE_AXIS_FSDP] > 1)
        NAMED_ERROR(c, "shared.ffn", "a shared expert needs mesh.ep = 1 and mesh.fsdp = 1 (got %d and %d): the "
                    "expert-parallel and FSDP paths do not carry it yet", s->mesh.size[MOE_AXIS_EP],
                    s->mesh.size[MOE_AXIS_FSDP]);
    else if (rows > MOE_LIMIT_ROWS)
        NAMED_ERROR(c, "tokens", "tokens * (top_k + shared.ffn/ffn) (%lld) exceeds the limit of %lld rows", rows,
                    MOE_LIMIT_ROWS);
    else if (welems > MOE_LIMIT_WEIGHT_ELEMS)
        NAMED_ERROR(c, "shared.ffn", "(experts + shared.ffn/ffn) * 2 * ffn * hidden (%lld) exceeds the limit of %lld "
                    "weight elements", welems, MOE_LIMIT_WEIGHT_ELEMS);
}

/* The fp8 layer's relations (quant.weights = "fp8_e4m3"; docs/DESIGN.md,
 * "FP8"): run after check_shared, on a spec whose keys all read. */
static void check_quant(moe_spec_ctx_t *c, const moe_spec_t *s) {
    if (!moe_spec_fp8(s))
        return;
    int sm80 = 0;
    for (int i = 0; i < s->narch; i++)
        sm80 |= s->arch[i] == MOE_ARCH_SM80;
    if (s->dtype != MOE_DTYPE_BF16)
        NAMED_ERROR(c, "dtype", "dtype = \"%s\" with quant.weights = \"fp8_e4m3\": the fp8 layer's input and output "
                    "are bf16 (DeepSeek-V3's recipe); use dtype = \"bf16\"", moe_dtype_name(s->dtype));
    else if (s->hidden % MOE_FP8_BLOCK)
        NAMED_ERROR(c, "hidden", "hidden (%d) must be a multiple of %d with quant.weights = \"fp8_e4m3\": the scales "
                    "cover blocks of %d columns", s->hidden, MOE_FP8_BLOCK, MOE_FP8_BLOCK);
    else if (s->ffn % MOE_FP8_BLOCK)
        NAMED_ERROR(c, "ffn", "ffn (%d) must be a multiple of %d with quant.weights = \"fp8_e4m3\": the scales cover "
                    "blocks of %d rows and columns", s->ffn, MOE_FP8_BLOCK, MOE_FP8_BLOCK);
    else if (sm80)
        NAMED_ERROR(c, "arch", "arch lists \"sm_80\", which has no fp8 tensor cores (they need sm_89 or later; "
                    "moegen's fp8 GEMMs are sm_90a): with quant.weights = \"fp8_e4m3\" use arch = { \"sm_90a\" }");
    else if (s->training)
        NAMED_ERROR(c, "quant.weights", "quant.weights = \"fp8_e4m3\" with training = true is not supported: the "
                    "backward is bf16 only");
    /* every mesh carries fp8: FSDP gathers the e4m3 weights and scales
     * (moe_gather_weights), the EP dispatch moves e4m3 rows and scales */
}

/* The weight gradients' type: "dtype" is a backward's choice. */
static void check_weight_grads(moe_spec_ctx_t *c, const moe_spec_t *s) {
    if (s->weight_grads == MOE_WGRADS_DTYPE && !s->training)
        NAMED_ERROR(c, "weight_grads", "weight_grads = \"dtype\" without training = true: only the backward "
                    "writes weight gradients; add training = true or leave weight_grads out");
}

/* Zero-computation experts (zero_experts > 0; docs/DESIGN.md, "Zero
 * experts"): entries of indices >= experts take no weight slot and no
 * expert row; what carries them is the forward without a dispatch. Run after
 * check_quant, on a spec whose keys all read. */
static void check_zero_experts(moe_spec_ctx_t *c, const moe_spec_t *s) {
    const int z = s->zero_experts;
    if (!z)
        return;
    static const char why[] = "with zero_experts";
    if (s->training)
        NAMED_ERROR(c, "training", "training = true %s (%d) is not supported: the backward has no zero-expert "
                    "entries (LongCat-Flash's zero experts are inference here)", why, z);
    else if (s->mesh.size[MOE_AXIS_EP] > 1)
        NAMED_ERROR(c, "mesh.ep", "mesh.ep = %d %s (%d) is not supported: the expert-parallel dispatch sends every "
                    "entry to a rank's slot, and a zero expert has none", s->mesh.size[MOE_AXIS_EP], why, z);
    else if (s->router.apply == MOE_APPLY_INPUT)
        NAMED_ERROR(c, "router.apply", "router.apply = \"input\" %s (%d) is not supported: a zero expert adds w·x, "
                    "the weight on its output", why, z);
    else if (s->router.score == MOE_SCORE_SPARSEMIXER)
        NAMED_ERROR(c, "router.score", "router.score = \"sparsemixer\" %s (%d) is not supported (Phi-3.5-MoE has "
                    "none)", why, z);
    else if (s->router.groups > 1)
        NAMED_ERROR(c, "router.groups", "router.groups = %d %s (%d) is not supported: the groups split the routed "
                    "experts, and the zero experts are in none", s->router.groups, why, z);
    else if (s->shared.ffn)
        NAMED_ERROR(c, "shared.ffn", "shared.ffn %s (%d) is not supported: the shared expert's slots sit at the "
                    "indices after the routed experts, where the zero experts are scored", why, z);
    else if (moe_spec_fp8(s))
        NAMED_ERROR(c, "quant.weights", "quant.weights = \"fp8_e4m3\" %s (%d) is not supported: the fp8 scatter "
                    "writes quantized rows, and a zero expert's output is the bf16 x", why, z);
    else if (moe_spec_scored(s) > MOE_LIMIT_EXPERTS)
        NAMED_ERROR(c, "zero_experts", "experts + zero_experts (%d) exceeds the limit of %d scored experts",
                    moe_spec_scored(s), MOE_LIMIT_EXPERTS);
}

/* Fill s from the spec's table at the stack top: defaults, then every row
 * of the schema (type, range, choices), then each row's own relations, then
 * the relations between keys; keys not in effect go back to their defaults. */
void moe_spec_read(moe_spec_ctx_t *c, moe_spec_t *s) {
    lua_State *L = c->L;
    int env = lua_gettop(L);
    char names[MOE_SPEC_MAX_KEYS][32];
    const char *known[MOE_SPEC_MAX_KEYS + 1];
    known_keys(NULL, names, known);
    check_keys(c, env, NULL, known);
    moe_spec_set_defaults(s);

    int tbl = env;
    for (int i = 0; i < moe_spec_nkeys && !c->failed; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        size_t tl = strcspn(k->name, ".");
        if (!k->name[tl]) {
            lua_settop(L, env);
            tbl = env;
        } else if (i == 0 || strncmp(moe_spec_keys[i - 1].name, k->name, tl + 1) != 0) {
            /* the first key of a table: the table itself, and its unknown keys */
            char parent[32];
            snprintf(parent, sizeof parent, "%.*s", (int)tl, k->name);
            lua_settop(L, env);
            tbl = get_table(c, env, (moe_keyref_t){NULL, parent});
            if (!c->failed) {
                known_keys(parent, names, known);
                check_keys(c, tbl, parent, known);
            }
        }
        read_key(c, tbl, k, s);
    }
    lua_settop(L, env);

    for (int i = 0; i < moe_spec_nkeys && !c->failed; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        if (k->type != MOE_KEY_INT)
            continue;
        int v = moe_spec_key_int(s, k->name), o;
        if (k->multiple && v % k->multiple)
            NAMED_ERROR(c, k->name, "%s (%d) must be a multiple of %d", k->name, v, k->multiple);
        else if (k->at_most && v > (o = moe_spec_key_int(s, k->at_most)))
            NAMED_ERROR(c, k->name, "%s (%d) must not exceed %s (%d)", k->name, v, k->at_most, o);
        else if (k->divides && (o = moe_spec_key_int(s, k->divides)) % v)
            NAMED_ERROR(c, k->name, "%s (%d) must divide %s (%d)", k->name, v, k->divides, o);
    }
    if (!c->failed)
        check_relations(c, s);
    if (!c->failed)
        check_sparsemixer(c, s);
    if (!c->failed)
        check_given(c, s);
    if (!c->failed)
        check_router_extras(c, s);
    if (!c->failed)
        check_shared(c, s);
    if (!c->failed)
        check_quant(c, s);
    if (!c->failed)
        check_zero_experts(c, s);
    if (!c->failed)
        check_weight_grads(c, s);
    if (!c->failed)
        moe_spec_reset_unused(s);
}
