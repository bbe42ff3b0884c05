#!/usr/bin/env python3
"""Generates and builds the stand-in CANN libraries the real torch_npu wheel loads.

Usage: gen_standin.py TORCH_NPU_DIR OUT_DIR

Reads the dynamic symbols the torch_npu wheel's libraries leave undefined (nm -D) and
the shared libraries they need (readelf -d): those `import torch_npu` loads and those of
torchair inside the wheel (torch_npu/dynamo/torchair/core/*.so). Every symbol that
neither torch, torch_npu nor the system libraries define is a CANN symbol: the ACL
runtime's (acl*, rt*, Msprof*, Hccl*), GE's C++ API (ge::...) and securec's (*_s). It
writes OUT_DIR/standin.c: the fake ACL runtime of the C tests (tests/fake_acl/fake_acl.c:
memory, streams, events, virtual memory, test controls), standin_extra.c (device
initialisation, copies, contexts, graph capture and its rules, resource limits,
securec) and a stub for every other CANN symbol; compiles it into OUT_DIR/libascendcl.so
and links every other CANN library name torch_npu and torchair need (libhccl.so,
libge_runner.so, libfmk_parser.so, libascend_protobuf.so, ...) to that one file, so the
process has one stand-in runtime whatever name a library or a dlopen asks for.

OUT_DIR/libopapi.so is the operator library torch_npu's op plugin opens with dlopen and
dlsym (op_plugin/utils/op_api_common*.h in the wheel): an entry for every `aclnn*` name
in libtorch_npu.so and for every function the header resolves from it (the
aclCreate*/aclDestroy* tensor and array constructors). With it the plugin runs operators
through aclnn, as on a current CANN, instead of falling back to aclop (which a graph
capture refuses).

A stub returns 0 (ACL_SUCCESS, GE's SUCCESS, a NULL pointer) and does nothing; kernels
do nothing. Also builds OUT_DIR/libcuda_keys_interposer.so (see
cuda_keys_interposer.cpp), to preload when torch is the CUDA build. Prints the counts.

Nothing generated is kept in the repository: the test scripts run this at test time.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FAKE_ACL = REPO / "tests" / "fake_acl" / "fake_acl.c"
EXTRA = HERE / "standin_extra.c"
# fake_acl.c functions standin_extra.c wraps (graph capture, virtual memory before a
# device is set, allocations during a capture): included under the name fake_base_<name>.
WRAPPED = ("aclrtRecordEvent", "aclrtStreamWaitEvent", "aclrtReserveMemAddress", "aclrtReleaseMemAddress",
           "aclrtMalloc", "aclrtMallocAlign32")
# torch_npu libraries loaded by `import torch_npu` (libop_plugin_atb.so loads only
# with the ATB operators, which need libatb from the NPU toolkit), then torchair's
# (`import torchair` and its reduce-overhead mode); each pattern must match.
LOADED = ("_C*.so", "lib/libtorch_npu.so", "lib/libtensorpipe.so", "lib/libnpu_profiler.so",
          "dynamo/torchair/core/*.so")
SYSTEM_PREFIXES = ("libc.", "libm.", "libdl.", "librt.", "libpthread.", "libstdc++.", "libgcc_s.",
                   "ld-linux")
# CANN's C names, GE's C++ API (namespace ge, mangled) and securec's bounded string
# functions (CANN ships libc_sec.so; torchair calls them through libascendcl's users).
CANN_NAME = re.compile(r"^(acl|rt|Msprof|Hccl|hccl|ge|Ge|dvm|prof|_ZN2ge|_ZNK2ge|[a-z]+_s$)", re.ASCII)
# The op plugin's headers, which name what it resolves from libopapi.so.
OPAPI_HEADERS = "include/third_party/op-plugin/op_plugin/utils/op_api_common*.h"


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def dyn_symbols(path, undefined):
    """Dynamic symbols of a library, version suffixes dropped."""
    flag = "--undefined-only" if undefined else "--defined-only"
    out = set()
    for line in run("nm", "-D", flag, str(path)).splitlines():
        parts = line.split()
        if not parts:
            continue
        if undefined and parts[0] != "U":
            continue  # weak references may stay unresolved
        out.add(parts[-1].split("@")[0])
    return out


def needed(path):
    return re.findall(r"\(NEEDED\).*\[(.+?)\]", run("readelf", "-d", str(path)))


def system_lib(name):
    """The path the dynamic loader would use for a system library, from ldconfig."""
    for line in run("ldconfig", "-p").splitlines():
        line = line.strip()
        if line.startswith(name + " ") and "x86-64" in line:
            return line.rsplit(" ", 1)[-1]
    return None


def opapi_names(tnpu):
    """The functions torch_npu's op plugin looks up in libopapi.so: every `aclnn*` string
    of libtorch_npu.so (GET_OP_API_FUNC and EXEC_NPU_CMD stringify the operator's name,
    and its `...GetWorkspaceSize` twin), and every function the plugin's headers resolve
    through a typedef'd pointer `_aclXxx` or GET_OP_API_FUNC(aclXxx)."""
    data = (tnpu / "lib" / "libtorch_npu.so").read_bytes()
    names = {m.decode() for m in re.findall(rb"(?<=\x00)aclnn[A-Za-z0-9_]+(?=\x00)", data)}
    for header in tnpu.glob(OPAPI_HEADERS):
        text = header.read_text(errors="replace")
        names.update(re.findall(r"\(\*_(acl[A-Za-z0-9_]+)\)", text))
        names.update(n for n in re.findall(r"GET_OP_API_FUNC\((acl[A-Za-z0-9_]+)\)", text))
    return sorted(names)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tnpu = Path(sys.argv[1]).resolve()
    out = Path(sys.argv[2]).resolve()
    torch_lib = tnpu.parent / "torch" / "lib"
    loaded = [p for pat in LOADED for p in sorted(tnpu.glob(pat))]
    unmatched = [pat for pat in LOADED if not list(tnpu.glob(pat))]
    if unmatched:
        sys.exit("gen_standin: %s does not look like a torch_npu 2.x install with torchair "
                 "(nothing matches %s)" % (tnpu, " ".join(unmatched)))
    undefined, libs = set(), set()
    for lib in loaded:
        undefined |= dyn_symbols(lib, True)
        libs.update(needed(lib))
    present = {p.name for p in list(tnpu.glob("lib/*.so*")) + list(torch_lib.glob("*.so*")) + loaded}
    defined = set()
    for p in set(list(tnpu.glob("lib/*.so")) + list(torch_lib.glob("*.so*")) + loaded):
        defined |= dyn_symbols(p, False)
    missing_libs = []
    for name in sorted(libs):
        if name in present:
            continue
        sys_path = system_lib(name)
        if sys_path:
            defined |= dyn_symbols(sys_path, False)
        elif name.startswith(SYSTEM_PREFIXES):
            sys.exit("gen_standin: system library %s not found by ldconfig" % name)
        else:
            missing_libs.append(name)
    for name in ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"):
        p = system_lib(name)
        if p:
            defined |= dyn_symbols(p, False)
    import sysconfig
    pylib = Path(sysconfig.get_config_var("LIBDIR") or "/", sysconfig.get_config_var("LDLIBRARY") or "-")
    if pylib.is_file():
        defined |= dyn_symbols(pylib, False)
    cann = sorted(s for s in undefined - defined if s != "__tls_get_addr")
    odd = [s for s in cann if not CANN_NAME.match(s)]
    if odd:
        sys.exit("gen_standin: undefined symbols that are not CANN's (a missing system or torch "
                 "library?): %s" % " ".join(odd))

    out.mkdir(parents=True, exist_ok=True)
    base = out / "base.o"
    src_base = out / "base.c"
    includes = ["#define %s fake_base_%s" % (w, w) for w in WRAPPED]
    includes += ['#include "%s"' % FAKE_ACL]
    includes += ["#undef %s" % w for w in WRAPPED]
    includes += ['#include "%s"' % EXTRA]
    src_base.write_text("\n".join(includes) + "\n")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-c", "-fPIC", "-O1", "-fvisibility=hidden", str(src_base), "-o", str(base)],
                   check=True)
    have = {line.split()[-1] for line in run("nm", "--defined-only", "-g", str(base)).splitlines()
            if line.strip()}
    stubs = [s for s in cann if s not in have]
    lines = ['/* Generated by tests/torch_npu/standin/gen_standin.py; do not edit. */']
    lines += includes + [""]
    lines += ["EXPORT int %s(void) { return 0; }" % s for s in stubs]
    src = out / "standin.c"
    src.write_text("\n".join(lines) + "\n")
    lib = out / "libascendcl.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-Wl,-soname,libascendcl.so",
                    str(src), "-lpthread", "-o", str(lib)], check=True)
    base.unlink()
    src_base.unlink()
    opapi = opapi_names(tnpu)
    if not any(n.startswith("aclnn") for n in opapi) or "aclCreateTensor" not in opapi:
        sys.exit("gen_standin: no aclnn operators or aclCreateTensor found in %s; the op "
                 "plugin's lookup has changed" % tnpu)
    opapi_src = out / "opapi.c"
    opapi_src.write_text("/* Generated by tests/torch_npu/standin/gen_standin.py; do not edit. */\n"
                         + "".join("int %s(void) { return 0; }\n" % n for n in opapi))
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-Wl,-soname,libopapi.so", str(opapi_src),
                    "-o", str(out / "libopapi.so")], check=True)
    opapi_src.unlink()
    for name in missing_libs:
        if name not in ("libascendcl.so", "libopapi.so"):
            link = out / name
            if link.exists() or link.is_symlink():
                link.unlink()
            link.symlink_to("libascendcl.so")
    interposer = out / "libcuda_keys_interposer.so"
    subprocess.run([os.environ.get("CXX", "c++"), "-shared", "-fPIC", "-O1", "-std=c++17",
                    str(HERE / "cuda_keys_interposer.cpp"), "-ldl", "-o", str(interposer)], check=True)
    print("stand-in CANN: %d symbols (%d with behaviour, %d stubs), libraries: %s -> %s; "
          "libopapi.so: %d entries"
          % (len(cann), len(cann) - len(stubs), len(stubs), " ".join(missing_libs), lib, len(opapi)))


if __name__ == "__main__":
    main()
