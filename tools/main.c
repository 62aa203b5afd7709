/* fastgen: the command-line tool. Each command is tools/cmd_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "fastgen.h"
#include "tools/cli.h"

/* ------------------------------------------------------------------ main */

static const char *k_help = "usage: fastgen <command> [options]\n"
                            "\n"
                            "commands:\n"
                            "  generate  text from a GGUF or llama2.c model, its attention and KV cache in fastgen\n"
                            "  profile   the policy of every head and the recovery of every shortlist entry\n"
                            "  eval      quality vs memory: fastgen-adaptive and FastGen against H2O,\n"
                            "            StreamingLLM, TOVA, SnapKV and AdaKV (--sweep), retrieval (--passkey),\n"
                            "            chats (--chat)\n"
                            "  demo      a question about a long document with the full cache and at half of it\n"
                            "            (SmolLM2 when found, else stories260K, else a synthetic workload)\n"
                            "  bench     llama-bench's pp/tg table, the full cache against compression\n"
                            "  info      what a model file (GGUF or llama2.c) holds, and whether fastgen runs it\n"
                            "  calibrate a model's key scorer for fastgen-adaptive:observe=scores (the\n"
                            "            retrieval-safe observation without a second pass)\n"
                            "  tokenize  the token ids of a text under a model's tokenizer\n"
                            "  version   print the library version\n"
                            "\n"
                            "`fastgen <command> --help` describes each command.\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("fastgen: no command (generate, profile, eval, demo, bench, info, calibrate, tokenize, version; try `fastgen --help`)\n",
              stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(k_help, stdout);
        return 0;
    }
    if (!strcmp(cmd, "generate"))
        return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "profile"))
        return cmd_profile(argc - 2, argv + 2);
    if (!strcmp(cmd, "eval"))
        return cmd_eval(argc - 2, argv + 2);
    if (!strcmp(cmd, "demo"))
        return cmd_demo(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench"))
        return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "info"))
        return cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate"))
        return cmd_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize"))
        return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version"))
        return cmd_version(argc - 2, argv + 2);
    fprintf(stderr, "fastgen: unknown command \"%s\" (try `fastgen --help`)\n", cmd);
    return 2;
}
