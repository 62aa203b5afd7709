/* fastgen tokenize: the token ids of a text under a model's tokenizer. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char *k_tokenize_help =
    "usage: fastgen tokenize [options]\n"
    "\n"
    "Prints the tokens of a text under a model's tokenizer, one a line: id and piece\n"
    "(as llama.cpp's llama-tokenize does); --ids prints the ids alone on one line.\n"
    "\n"
    "options:\n"
    "  -m, --model FILE      GGUF file or llama2.c checkpoint (default: stories260K, as generate)\n"
    "  -z, --tokenizer FILE  llama2.c tokenizer beside a llama2.c checkpoint\n"
    "  -p, --prompt TEXT     the text (default \"Once upon a time\")\n"
    "  -f, --file FILE       the text is the whole of FILE (- for standard input)\n"
    "  --ids                 the ids only, on one line, separated by spaces\n"
    "  --bos                 BOS first, when the vocabulary asks for one (as a prompt gets it)\n"
    "  --no-special          control tokens spelled in the text stay text (llama.cpp's parse_special off)\n";

typedef struct tokenize_opts {
    int bos, special, ids;
} tokenize_opts;

static int tokenize_extra(void *user, const char *opt, const char *val, int *used_val) {
    (void)val;
    tokenize_opts *x = user;
    *used_val = 0;
    if (!strcmp(opt, "--bos"))
        x->bos = 1;
    else if (!strcmp(opt, "--no-special"))
        x->special = 0;
    else if (!strcmp(opt, "--ids"))
        x->ids = 1;
    else
        return 2;
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    cli_opts o;
    cli_defaults(&o, 0);
    tokenize_opts x = {0, 1, 0};
    int rc = cli_parse("tokenize", k_tokenize_help, CLI_MODEL | CLI_PROMPT, argc, argv, &o, tokenize_extra, &x);
    if (rc)
        return rc < 0 ? 0 : rc;
    char model[4096], tokpath[4096];
    if ((rc = cli_need_model("tokenize", &o, model, tokpath, sizeof model)) != 0 ||
        (rc = cli_read_prompt("tokenize", &o)) != 0) {
        cli_opts_free(&o);
        return rc;
    }
    char *text = o.prompt_text;
    cli_session s;
    char err[512];
    if (cli_load(&o, &s, err, sizeof err) != FG_OK) {
        fprintf(stderr, "fastgen tokenize: %s\n", err);
        free(text);
        return 1;
    }
    const char *src = text ? text : o.prompt;
    const int32_t cap = (int32_t)strlen(src) + 2;
    int32_t *ids = malloc((size_t)cap * sizeof *ids), n = 0;
    const int flags = (x.bos ? FGM_ENCODE_BOS : 0) | (x.special ? FGM_ENCODE_SPECIAL : 0);
    fg_status st = ids ? fgm_tokenizer_encode(&s.tok, src, flags, ids, cap, &n) : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK && x.ids) {
        for (int32_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
    } else if (st == FG_OK) {
        for (int32_t i = 0; i < n; i++) { /* its text (a control token: its piece) */
            const int32_t id = ids[i];
            const char *piece = !s.tok.control[id]                ? fgm_tokenizer_decode(&s.tok, -1, id)
                                : s.tok.kind == FGM_TOKENIZER_BPE ? s.tok.text[id]
                                                                 : s.tok.pieces[id];
            printf("%6d -> '", (int)id);
            for (const unsigned char *c = (const unsigned char *)piece; *c; c++) /* control bytes escaped */
                if (*c < 0x20 || *c == 0x7f)
                    printf("\\x%02x", *c);
                else
                    putchar(*c);
            printf("'\n");
        }
    } else {
        fprintf(stderr, "fastgen tokenize: %s\n", fg_status_string(st));
    }
    free(ids);
    free(text);
    cli_close(&s);
    return st == FG_OK ? 0 : 1;
}
