#!/usr/bin/env python3
"""Runs a hipcc compile with the compiler's kernel resource remarks and says
which kernels use scratch memory (spilled registers, or register arrays
indexed at run time: memory traffic a decode kernel must not have).

    scratch_check.py warn|error -- HIPCC ARGS...

The remarks themselves are not shown (hundreds of lines a file); every other
line of the compiler's output is. With `error`, a kernel that uses scratch
fails the compile, as nvcc's `-Xptxas -warn-spills,-warn-lmem-usage,-Werror`
does for CUDA (meson option gpu-spills). The hipcc compile runs once per
offload architecture in one process; the remarks say which kernel, not
which architecture (scripts/gpu-resources.sh tells them apart).
"""
import re
import subprocess
import sys


# a line of the compiler's own: a located diagnostic, the driver's, a summary, an include trace
DIAGNOSTIC = re.compile(r"\S+:\d+:\d+: |\S*clang\S*: |(fatal )?error|warning|In file included|\d+ (error|warning)")


def main(argv):
    if len(argv) < 3 or argv[0] not in ("warn", "error") or argv[1] != "--":
        print("usage: scratch_check.py warn|error -- HIPCC ARGS...", file=sys.stderr)
        return 2
    mode, cmd = argv[0], argv[2:] + ["-Rpass-analysis=kernel-resource-usage"]
    run = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    kernel, found, in_remark = None, {}, False
    for line in (run.stdout + run.stderr).splitlines():
        m = re.search(r"remark:\s+Function Name: (\S+)", line)
        if m:
            kernel = m.group(1)
        m = re.search(r"remark:\s+ScratchSize \[bytes/lane\]: (\d+)", line)
        if m and int(m.group(1)) and kernel:  # once per offload architecture: the largest kept
            found[kernel] = max(found.get(kernel, 0), int(m.group(1)))
        if "-Rpass-analysis=kernel-resource-usage" in line:
            in_remark = True  # a remark: hidden, with the source line and caret under it
            continue
        if in_remark and not DIAGNOSTIC.match(line):
            continue  # the remark's source line and caret
        in_remark = False
        print(line, file=sys.stderr)
    found = list(found.items())
    try:
        names = subprocess.run(["c++filt"], input="\n".join(k for k, _ in found), capture_output=True, text=True,
                               check=True).stdout.splitlines()
        found = [(n.split("(")[0], size) for n, (_, size) in zip(names, found)]
    except (OSError, subprocess.CalledProcessError):
        pass  # mangled names, then
    for kernel, size in found:
        print(f"{mode}: HIP kernel {kernel} uses {size} bytes of scratch memory a lane (spilled registers or an "
              f"indexed register array; scripts/gpu-resources.sh shows each architecture)", file=sys.stderr)
    if run.returncode:
        return run.returncode
    return 1 if found and mode == "error" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
