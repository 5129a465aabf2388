@ -- sandbox hole: pattern backtracking inside string.find, which runs in C
@ -- where the instruction hook does not count. Four lazy quantifiers over
@ -- 5000 bytes that never match take O(n^5) steps; the pattern functions
@ -- charge their worst-case work to the instruction count first.
@ local s = string.rep("a", 5000)
@ local found = s:find(".-.-.-.-b")
