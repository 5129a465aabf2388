@ -- sandbox hole: output that grows without bound in C memory, outside the
@ -- Lua allocator's limit (a 1 MiB string written 100000 times).
@ local s = string.rep("x", 1 << 20)
@ for i = 1, 100000 do __out(1, s) end
