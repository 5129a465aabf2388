@ -- an unfinished Lua line before a text line: Lua's message named the
@ -- translation's internal output function ('then' expected near '__out')
@ if true
int sandbox_unfinished_if;
@ end
