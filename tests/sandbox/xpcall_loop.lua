@ -- sandbox hole: xpcall (with a handler that swallows everything)
@ -- catching the instruction limit.
@ while true do xpcall(function() while true do end end, function() return "swallowed" end) end
