/* version.h — the generator's version: the one home of the string that
 * stamps every emitted file, keys the JIT cache, and names the pkg-config
 * version (the Makefile reads it from here). runtime/moe.h repeats it as
 * MOE_VERSION_MAJOR/MINOR/PATCH for programs (test_abi holds them equal). */
#ifndef MOEGEN_VERSION_H
#define MOEGEN_VERSION_H

#define MOEGEN_VERSION "0.1.0"

#endif
