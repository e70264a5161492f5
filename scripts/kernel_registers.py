#!/usr/bin/env python3
"""Registers, spills and shared memory of met's CUDA kernels, from ptxas, without a GPU.

Compiles the kernel module the way `met-kernels` does at startup (the `.cu` files in the
order `crates/kernels/src/cuda/compile.rs` lists them, `--std=c++17`) with NVRTC and
`--ptxas-options=-v`, then prints one line per kernel whose name matches PATTERN: registers a
thread, spill stores/loads in bytes, static shared memory. A kernel near 255 registers or
spilling is worth a look before any profile: its occupancy is capped by them.

Usage: kernel_registers.py [PATTERN] [--arch sm_90a] [--sass]
`--sass` also prints, per matching kernel, its SASS instruction count by opcode (from
`cuobjdump` and `nvdisasm`: the `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels, or
CUOBJDUMP with nvdisasm beside it; SASS_DIR=dir writes each listing there), the way to compare what two
forms of a kernel issue before a device run.
NVRTC comes from the `nvidia-cuda-nvrtc` wheel (pip install "nvidia-cuda-nvrtc>=13,<14"), or
set NVRTC_LIB to a libnvrtc.so.
"""

import ctypes
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "crates", "kernels")


def nvrtc():
    path = os.environ.get("NVRTC_LIB")
    if not path:
        import nvidia  # the wheel's namespace package

        found = [p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "libnvrtc.so*"))]
        if not found:
            sys.exit("no libnvrtc.so: pip install 'nvidia-cuda-nvrtc>=13,<14' or set NVRTC_LIB")
        path = sorted(found)[0]
    return ctypes.CDLL(path)


def source():
    compile_rs = open(os.path.join(KERNELS, "src", "cuda", "compile.rs")).read()
    names = re.findall(r'\("([a-z_0-9]+\.cuh?)", include_str!', compile_rs)
    return "".join(f"// ---- {n} ----\n" + open(os.path.join(KERNELS, "cuda", n)).read() + "\n" for n in names)


def main():
    args = sys.argv[1:]
    arch = "sm_90a"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i : i + 2]
    sass = "--sass" in args
    if sass:
        args.remove("--sass")
    pattern = re.compile(args[0] if args else ".")
    lib = nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source().encode(), b"met_kernels.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--std=c++17", f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    if rc:
        sys.exit(text)
    rows = []
    for m in re.finditer(
        r"entry function '([^']+)'.*?(\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers(.*?)\n",
        text,
        re.S,
    ):
        name, stores, loads, regs, rest = m.groups()
        if pattern.search(name):
            smem = re.search(r"(\d+) bytes smem", rest)
            rows.append((int(regs), name, int(stores), int(loads), int(smem.group(1)) if smem else 0))
    print(f"{'kernel':48} {'regs':>5} {'spill st/ld':>12} {'smem':>7}")
    for regs, name, stores, loads, smem in sorted(rows, reverse=True):
        print(f"{name:48} {regs:5} {f'{stores}/{loads}':>12} {smem:7}")
    if sass:
        print_sass(lib, prog, [name for _, name, *_ in rows])


def cuobjdump():
    path = os.environ.get("CUOBJDUMP")
    if path:
        return path
    import nvidia

    found = [p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "bin", "cuobjdump"))]
    if not found:
        sys.exit("no cuobjdump: pip install 'nvidia-cuda-cuobjdump>=13,<14' 'nvidia-cuda-nvdisasm>=13,<14' or set CUOBJDUMP")
    return found[0]


def print_sass(lib, prog, names):
    import collections
    import subprocess
    import tempfile

    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin.raw)
        f.flush()
        for name in names:
            tool = cuobjdump()
            env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
            text = subprocess.run([tool, "-sass", "-fun", name, f.name], capture_output=True, text=True, env=env).stdout
            ops = collections.Counter(
                m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
            )
            total = sum(ops.values())
            top = ", ".join(f"{op} {n}" for op, n in ops.most_common(14))
            print(f"\n{name}: {total} instructions\n  {top}")
            if os.environ.get("SASS_DIR"):
                with open(os.path.join(os.environ["SASS_DIR"], name + ".sass"), "w") as out:
                    out.write(text)


if __name__ == "__main__":
    main()
