/* version.h — the generator's version: the one home of the string that
 * stamps every emitted file, keys the JIT cache, and names the pkg-config
 * version (the Makefile reads it from here). */
#ifndef MOEGEN_VERSION_H
#define MOEGEN_VERSION_H

#define MOEGEN_VERSION "0.1.0"

#endif
