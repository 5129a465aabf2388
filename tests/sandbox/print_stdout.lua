@ -- sandbox hole: print writing to the standard output of the program
@ -- that expands the template (a library must never print to stdout).
@ print("sandbox-print-leak")
