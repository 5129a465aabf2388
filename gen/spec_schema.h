/* spec_schema.h — the spec's keys as one table (internal to the spec files
 * and their tests).
 *
 * One row per key, nested keys included ("router.score"): its type, where
 * its value lives in moe_spec_t, its default, its range or choices, the
 * relations to other keys that belong to it alone, and its help text. The
 * loader (spec.c) validates and fills in defaults from the rows; the
 * canonical form and README's key table are written from them. Relations
 * between keys that are not one key's property (a group must divide the
 * experts over a mesh, ...) are the short list of checks in spec.c after the
 * table pass. */
#ifndef MOEGEN_SPEC_SCHEMA_H
#define MOEGEN_SPEC_SCHEMA_H

#include "spec.h"

/* Size limits that keep every size computation in range: row counts and
 * offsets fit int32, tensor element counts fit comfortably in int64. */
#define MOE_LIMIT_NAME 47                   /* characters of name (MOE_NAME_MAX holds it) */
#define MOE_LIMIT_EXPERTS 4096
#define MOE_LIMIT_TOP_K 32
#define MOE_LIMIT_DIM 65536
#define MOE_LIMIT_TOKENS (1 << 20)
#define MOE_LIMIT_ROWS (1LL << 28)          /* tokens * top_k */
#define MOE_LIMIT_WEIGHT_ELEMS (1LL << 40)  /* experts * 2F * H */
#define MOE_LIMIT_AXIS 4096
#define MOE_LIMIT_WORLD 65536

typedef enum {
    MOE_KEY_IDENT, /* string: a C identifier of 1..hi characters */
    MOE_KEY_INT,   /* integer in [lo, hi] (stored as int) */
    MOE_KEY_NUM,   /* number in [lo, hi] (stored as double) */
    MOE_KEY_BOOL,  /* true or false (stored as bool) */
    MOE_KEY_ENUM,  /* string, one of choices (stored as the choice's value, an int-sized enum) */
    MOE_KEY_LIST,  /* list of distinct choices, a single string being a list of one */
} moe_key_type_t;

#define MOE_KEY_LIST_MAX 4   /* choices of a LIST row */
#define MOE_SPEC_MAX_KEYS 64 /* rows */

typedef struct {
    const char *name;        /* "experts" or "parent.key" (one level of nesting) */
    moe_key_type_t type;
    size_t offset;           /* of the value in moe_spec_t (a list: of its first element) */
    /* default: required (no default), or absent = "none" (stored as 0 and
     * left out of the canonical form), or the value def / def_list */
    bool required;
    bool optional;
    double def;              /* INT, NUM, BOOL (0/1), ENUM (a choice's index) */
    int def_list[MOE_KEY_LIST_MAX]; /* LIST: choice indices */
    int ndef_list;
    double lo, hi;           /* INT, NUM: the range; IDENT: hi = the longest name */
    const char *const *choices; /* ENUM, LIST: NULL-terminated */
    const int *values;       /* ENUM, LIST: the stored value of each choice; NULL: its index */
    const char *refused;     /* LIST: a value known but refused ("may name ... only, not ...") */
    size_t count_offset;     /* LIST: of the int item count; 0: the list names every choice once */
    /* relations that belong to this key alone (checked after every key is read) */
    int multiple;            /* INT: a multiple of this (0: any) */
    const char *at_most;     /* INT: not above this integer key */
    const char *divides;     /* INT: divides this integer key */
    const char *when;        /* takes effect only when this key is above 1 (an INT key) or is */
    const char *when_is;     /* ... this choice (an ENUM key); otherwise it is reset to its
                              * default and left out of the canonical form */
    const char *help;        /* README's meaning column (Markdown) */
} moe_key_t;

extern const moe_key_t moe_spec_keys[];
extern const int moe_spec_nkeys;

/* The row of a key by its full name ("router.score"), or NULL. */
const moe_key_t *moe_spec_key(const char *name);

/* The number of choices of an ENUM or LIST row. */
int moe_key_nchoices(const moe_key_t *k);

/* Integer value of the INT row named `name` in s (0 for an unknown name). */
int moe_spec_key_int(const moe_spec_t *s, const char *name);

/* Is row k in effect for s (no `when`, or its `when` condition holds)? */
bool moe_key_in_effect(const moe_key_t *k, const moe_spec_t *s);

/* Set every key of s to its default (required keys to 0). */
void moe_spec_set_defaults(moe_spec_t *s);

/* Reset to its default every key that is not in effect for s. */
void moe_spec_reset_unused(moe_spec_t *s);

/* README's spec-key table, as Markdown lines (header first, one row per
 * key, table order), ending in a newline. Caller frees; NULL when out of
 * memory. */
char *moe_spec_keys_markdown(void);

#endif
