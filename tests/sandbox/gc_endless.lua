@ -- sandbox hole: a finalizer that never returns. Finalizers run with the
@ -- instruction hook off (at a collection and when the state closes), so
@ -- an endless __gc would hang the process; metatables with __gc are refused.
@ setmetatable({}, {__gc = function() while true do end end})
