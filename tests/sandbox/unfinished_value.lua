@ -- a Lua line left open before a text line: the text line's output call
@ -- became its value (no error at all)
@ local x =
int sandbox_unfinished_value;
