@ -- sandbox hole: the output function handed a table, which has no string
@ -- form (it passed NULL to memcpy).
@ __out(1, {})
