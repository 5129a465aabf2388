"""build_cxx.py — what build_torch.py and build_jax.py share: the compile
step, the C++ runtime linked as a shared library, and the check that it was.

A library loaded into a process that already runs libstdc++.so (torch,
jaxlib) must use that libstdc++, not a private static copy: with one, the
first number an error message formats (std::ostream << long in c10::str)
crashed the process on the H200 machine (libmoegen_torch.so was 11 MB, no
libstdc++.so.6 among its NEEDED). That machine has libstdc++.so.6 but no
libstdc++.so (the development link), so the compiler's own -lstdc++ finds
GCC's libstdc++.a; a compiler that adds -static-libstdc++ does the same.
Naming the shared object itself (-l:libstdc++.so.6) before the compiler's
-lstdc++ links it in both cases; check_shared_runtime then reads the
result's dynamic section and refuses one without it."""
import os
import shlex
import struct
import subprocess

# link flags after the sources: the C++ runtime from libstdc++.so.6
LINK = ["-Wl,-Bdynamic", "-l:libstdc++.so.6"]


class BuildError(Exception):
    pass


def compile(cmd, out, cxx):
    """Run cmd (a compile and link, its output not named) writing out, and
    check the result; out is replaced only by a library that passed, never
    left half-written or unchecked. Raises BuildError."""
    tmp = "%s.tmp.%d" % (out, os.getpid())
    cmd = cmd + ["-o", tmp]
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        try:
            subprocess.check_call(cmd)
        except OSError as e:
            raise BuildError("%s: %s (a C++17 compiler is needed; name it with --cxx or $CXX)" % (cxx, e)) from None
        except subprocess.CalledProcessError as e:
            raise BuildError("%s failed with status %d (above)" % (cxx, e.returncode)) from None
        why = check_shared_runtime(tmp, cxx)
        if why:
            raise BuildError(why.replace(tmp, out))
        os.replace(tmp, out)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    return out


def needed(path):
    """The DT_NEEDED names of a 64-bit little-endian ELF shared object."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("%s is not a 64-bit little-endian ELF file" % path)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for s in sections:
        if s[1] != 6:   # SHT_DYNAMIC
            continue
        strtab = sections[s[6]]   # sh_link: its string table
        for off in range(s[4], s[4] + s[5], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == 1:   # DT_NEEDED
                end = data.index(b"\0", strtab[4] + val)
                names.append(data[strtab[4] + val:end].decode())
    return names


def check_shared_runtime(path, cxx):
    """None, or why the library at path cannot be loaded beside torch or jaxlib."""
    try:
        libs = needed(path)
    except (OSError, ValueError, struct.error) as e:
        return "cannot read %s's dynamic section: %s" % (path, e)
    if not any(n.startswith("libstdc++.so") for n in libs):
        return ("%s links the C++ runtime statically (its NEEDED: %s; %s found no libstdc++.so.6, or links "
                "libstdc++.a whatever it is given): it would crash beside the libstdc++.so.6 that torch and "
                "jaxlib load; use a compiler that links it shared (--cxx)" % (path, ", ".join(libs) or "none", cxx))
    return None
