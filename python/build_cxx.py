"""build_cxx.py — what build_torch.py and build_jax.py share: the C++
runtime linked as a shared library, and the check that it was.

A library loaded into a process that already runs libstdc++.so (torch,
jaxlib) must use that libstdc++, not a private static copy: with one, the
first number an error message formats (std::ostream << long in c10::str)
crashed the process on the H200 machine, whose g++ wrapper adds
-static-libstdc++ (libmoegen_torch.so was 11 MB, no libstdc++.so.6 among
its NEEDED). An explicit -lstdc++ before the compiler's own makes the
linker resolve against the shared library; check_shared_runtime then reads
the result's dynamic section and refuses one without it."""
import struct

# link flags after the sources: the C++ runtime from libstdc++.so
LINK = ["-Wl,-Bdynamic", "-lstdc++"]


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
        return ("%s links the C++ runtime statically (its NEEDED: %s; does %s add -static-libstdc++?): it would "
                "crash beside the libstdc++.so that torch and jaxlib load; use a compiler that links it "
                "shared (--cxx)" % (path, ", ".join(libs) or "none", cxx))
    return None
