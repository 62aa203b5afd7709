/* fastgen version: the library version, the backends built, the CPU. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <stdio.h>
#include <string.h>

#include "fastgen.h"
#include "tools/cli.h"

int cmd_version(int argc, char **argv) {
    if (argc == 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        fputs("usage: fastgen version\n\nPrints the library version, the backends this build serves and the CPU\n"
              "the cpu backend runs on (the instruction set its kernels use).\n",
              stdout);
        return 0;
    }
    if (argc > 0)
        return cli_usage("version", "takes no options");
    char cpu[256];
    fg_cpu_describe(cpu, sizeof cpu);
    printf("fastgen %s\nbackends: %s\ncpu: %s\n", fg_version(), fg_build_backends(), cpu);
    return 0;
}
