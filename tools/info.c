/* fastgen info: what a model file holds and whether fastgen can run it. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/dequant.h"
#include "tools/gguf.h"

static const char *k_info_help = "usage: fastgen info FILE\n"
                                 "\n"
                                 "Describes a GGUF file or a llama2.c checkpoint: architecture, shape, context,\n"
                                 "tensor types and counts, tokenizer, and whether fastgen can run it (and why\n"
                                 "not). Exit status 0 when it can, 1 when it cannot or the file is unreadable.\n";

static int info_gguf(const char *path) {
    fg_gguf g;
    char err[512];
    if (fg_gguf_open(path, &g, err, sizeof err) != FG_OK) {
        fprintf(stderr, "fastgen info: %s\n", err);
        return 1;
    }
    char arch[64], name[128], tok[64], pre[64];
    fg_gguf_get_str(&g, "general.architecture", arch, sizeof arch);
    fg_gguf_get_str(&g, "general.name", name, sizeof name);
    fg_gguf_get_str(&g, "tokenizer.ggml.model", tok, sizeof tok);
    fg_gguf_get_str(&g, "tokenizer.ggml.pre", pre, sizeof pre);
    printf("file:          %s (GGUF v%u, %zu bytes)\n", path, g.version, g.size);
    printf("name:          %s\n", name[0] ? name : "(none)");
    printf("architecture:  %s\n", arch[0] ? arch : "(none)");
    int64_t counts[FG_GGML_N_TYPES] = {0}, unknown = 0;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        if (g.tensors[i].type >= 0 && g.tensors[i].type < FG_GGML_N_TYPES)
            counts[g.tensors[i].type]++;
        else
            unknown++;
    }
    printf("tensors:       %lld:", (long long)g.n_tensors);
    for (int t = 0; t < FG_GGML_N_TYPES; t++)
        if (counts[t])
            printf(" %lld %s", (long long)counts[t], fg_type_info_of(t)->name);
    printf("\n");
    const fg_gguf_kv *tokens = fg_gguf_find(&g, "tokenizer.ggml.tokens");
    printf("tokenizer:     %s%s%s%s, %llu tokens\n", tok[0] ? tok : "(none)", pre[0] ? " (pre-tokenizer " : "", pre,
           pre[0] ? ")" : "", tokens ? (unsigned long long)tokens->n_elems : 0ull);
    fg_llama_model m;
    fg_status st = fg_llama_from_gguf(&g, &m, err, sizeof err);
    if (st == FG_OK) {
        const fg_llama_config *c = &m.config;
        printf("shape:         %d layers, width %d, MLP %d, %d query / %d KV heads of %d, vocabulary %d\n",
               (int)c->n_layers, (int)c->dim, (int)c->hidden_dim, (int)c->n_heads, (int)c->n_kv_heads,
               (int)c->head_size, (int)c->vocab_size);
        printf("context:       %d tokens; RoPE base %g; RMSNorm eps %g; %s classifier\n", (int)c->seq_len,
               (double)c->rope_theta, (double)c->rms_eps, c->shared_classifier ? "shared" : "separate");
        printf("weights:       %zu bytes as stored (kept in their types, mapped from the file)\n",
               fg_llama_weight_bytes(&m));
        fg_tokenizer t;
        st = fg_tokenizer_from_gguf(&g, c->vocab_size, &t, err, sizeof err);
        if (st == FG_OK)
            fg_tokenizer_free(&t);
        fg_llama_free(&m);
    }
    fg_gguf_free(&g);
    if (st == FG_OK)
        printf("fastgen:       can run it\n");
    else
        printf("fastgen:       cannot run it: %s\n", err);
    return st == FG_OK ? 0 : 1;
}

static int info_llama2c(const char *path) {
    fg_llama_model m;
    char err[512];
    fg_status st = fg_llama_load_file(path, &m, err, sizeof err);
    if (st) {
        fprintf(stderr, "fastgen info: %s\n", err);
        return 1;
    }
    const fg_llama_config *c = &m.config;
    printf("file:          %s (llama2.c checkpoint)\n", path);
    printf("architecture:  llama (llama2.c)\n");
    printf("shape:         %d layers, width %d, MLP %d, %d query / %d KV heads of %d, vocabulary %d\n",
           (int)c->n_layers, (int)c->dim, (int)c->hidden_dim, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_size,
           (int)c->vocab_size);
    printf("context:       %d tokens; %s classifier\n", (int)c->seq_len, c->shared_classifier ? "shared" : "separate");
    printf("weights:       %zu bytes, f32\n", fg_llama_weight_bytes(&m));
    printf("tokenizer:     a separate llama2.c tokenizer file (-z)\n");
    printf("fastgen:       can run it\n");
    fg_llama_free(&m);
    return 0;
}

int cmd_info(int argc, char **argv) {
    if (argc == 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        fputs(k_info_help, stdout);
        return 0;
    }
    if (argc != 1)
        return cli_usage("info", "expects one model file");
    return fg_gguf_is_gguf(argv[0]) ? info_gguf(argv[0]) : info_llama2c(argv[0]);
}

/* ------------------------------------------------------------ fastgen tokenize */

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
    const int flags = (x.bos ? FG_ENCODE_BOS : 0) | (x.special ? FG_ENCODE_SPECIAL : 0);
    fg_status st = ids ? fg_tokenizer_encode(&s.tok, src, flags, ids, cap, &n) : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK && x.ids) {
        for (int32_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
    } else if (st == FG_OK) {
        for (int32_t i = 0; i < n; i++) { /* its text (a control token: its piece) */
            const int32_t id = ids[i];
            const char *piece = !s.tok.control[id]                ? fg_tokenizer_decode(&s.tok, -1, id)
                                : s.tok.kind == FG_TOKENIZER_BPE ? s.tok.text[id]
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
