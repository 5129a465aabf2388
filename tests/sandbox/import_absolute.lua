@ -- sandbox hole: import() of an absolute path.
@ import("/tmp/outside")
