@ -- sandbox hole: pcall catching the instruction limit. Each inner loop
@ -- runs into the limit; a pcall that caught that error would let the outer
@ -- loop go on for ever. The limit must end the template.
@ while true do pcall(function() while true do end end) end
