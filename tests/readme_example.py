"""The C code block in README.md under "API example" is examples/quickstart.c."""
import re
import sys

readme, example = (open(p, encoding="utf-8").read() for p in sys.argv[1:3])
blocks = re.findall(r"```c\n(.*?)```", readme, re.S)
if example not in blocks:
    sys.exit("README.md does not show examples/quickstart.c verbatim; copy it into the ```c block")
print("1 passed, 0 failed")
