@ -- sandbox hole: import() reading a .lua file outside the templates folder
@ -- (a relative path up, an absolute path). Imports are template names only.
@ import("../outside")
